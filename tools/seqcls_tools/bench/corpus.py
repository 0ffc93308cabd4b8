"""The benchmark's inputs: a seeded corpus of zh / en / mixed sentences and a 74-label hierarchy.

Generated, not downloaded (nothing can be fetched at run time): Chinese sentences are drawn from
the most frequent characters of news text with Chinese punctuation, English ones from a small
news vocabulary, mixed ones combine both with numbers — 10 to 120 characters each, like the
short texts a hierarchical news classifier sees. The same seed gives the same corpus.
"""

from __future__ import annotations

import random

#: ~500 frequent characters of modern Chinese news text.
ZH_CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而"
    "方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好"
    "应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向"
    "道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特"
    "件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队"
    "南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风"
    "切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许"
    "步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列"
    "习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派"
    "层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严球队赛冠军融资裁员股票银行投资企业科技公司"
)
ZH_PUNCT = "，，，、。！？；：“”"
_EN_TEXT = (
    "the company announced layoffs of employees in this year startup raises million series funding round team "
    "wins championship final match market stocks rally after central bank cuts interest rates new product launch "
    "cloud service data model release players transfer club signs contract five years revenue growth quarter "
    "profit loss report government policy city school students teachers research study shows climate energy "
    "electric vehicle sales record high price increase online platform users mobile app security update league "
    "coach season injury merger acquisition investors shares analysts expect inflation exports trade deal talks "
    "minister election vote court ruling lawsuit tech giant chip supply chain factory workers strike union"
)
EN_WORDS = tuple(_EN_TEXT.split())


def _zh(rng: random.Random, n: int) -> str:
    out = []
    while len(out) < n - 1:
        out.append(rng.choice(ZH_CHARS))
        if len(out) > 4 and rng.random() < 0.08:
            out.append(rng.choice(ZH_PUNCT))
    return "".join(out[: n - 1]) + rng.choice("。！？")


def _en(rng: random.Random, n: int) -> str:
    words: list[str] = []
    while len(" ".join(words)) < n:
        word = rng.choice(EN_WORDS)
        if rng.random() < 0.05:
            word = str(rng.randint(2, 2024))
        words.append(word)
    text = " ".join(words)[: n - 1].rstrip()
    return text[:1].upper() + text[1:] + "."


def _mixed(rng: random.Random, n: int) -> str:
    zh_len = max(2, n // 2)
    parts = [_zh(rng, zh_len)[:-1], _en(rng, max(3, n - zh_len - 6))[:-1], f"{rng.randint(1, 99)}%"]
    rng.shuffle(parts)
    return " ".join(parts)[:n]


def make_corpus(n: int = 2000, *, seed: int = 0, min_chars: int = 10, max_chars: int = 120) -> list[str]:
    """``n`` sentences, a third each Chinese, English and mixed, lengths uniform in [min, max] chars."""
    rng = random.Random(seed)
    makers = (_zh, _en, _mixed)
    out = []
    for i in range(n):
        length = rng.randint(min_chars, max_chars)
        text = makers[i % 3](rng, length).strip()
        out.append(text if len(text) >= min_chars else text + "。" * (min_chars - len(text)))
    return out


def make_labels(n: int = 74) -> list[str]:
    """A two-level label hierarchy (``领域k`` parents with ``领域k##主题j`` children), ``n`` labels."""
    labels: list[str] = []
    parent = 0
    while len(labels) < n:
        labels.append(f"领域{parent}")
        for child in range(7):
            if len(labels) >= n:
                break
            labels.append(f"领域{parent}##主题{child}")
        parent += 1
    return labels[:n]
