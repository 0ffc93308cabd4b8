"""Generate the demo's hierarchical multi-label news-headline dataset (deterministically).

No public dataset can be downloaded here, so the demo ships its own: short Chinese (plus some
English and mixed zh-en) news sentences, labelled in the two-level ``parent##child`` style of
PaddleNLP's hierarchical classification app. Sentences come from hand-written templates filled
from slot vocabularies (``seqcls_tools.demo.slots``: companies, people, cities, amounts, teams...),
so the same template recurs with different words: a model has to learn the trigger words, not
memorise sentences. About a fifth of the texts (21%) describe two events from different branches.

The generated ``data/{train,dev,test}.jsonl`` are committed (versioned data); running
``python -m seqcls_tools.demo.make_dataset`` rewrites them byte-identically.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
from pathlib import Path

from seqcls_tools.demo import DATA_DIR, LABELS, SPLITS
from seqcls_tools.demo.slots import SLOTS

log = logging.getLogger(__name__)

SPLIT_SIZES = {"train": 1200, "dev": 160, "test": 240}
SEED = 20240607
#: Longer (joined) texts are redrawn, so nothing is cut at the tokenizer's max_length of 128.
MAX_CHARS = 110
#: Share of two-event texts (half natural combo templates, half two joined sentences).
TWO_EVENT_SHARE = 0.22

LEAVES: tuple[str, ...] = tuple(label for label in LABELS if "##" in label)

# --------------------------------------------------------------------------------------------
# Templates: one leaf each (its parent is added automatically)
# --------------------------------------------------------------------------------------------
TEMPLATES: dict[str, tuple[str, ...]] = {
    "组织关系##裁员": (
        "{co}{date}宣布裁员{pct}，主要涉及{dept}。",
        "{co}启动新一轮裁员，约{n}名员工受到影响。",
        "受业绩下滑拖累，{co}计划削减{n}个岗位。",
        "{co}{dept}被曝大规模裁员，员工称补偿按N+1执行。",
        "{co}确认优化{dept}人员，裁员比例约为{pct}。",
        "为降低成本，{co}将在{city}关闭工厂并遣散{n}名工人。",
        "{co_en} announced layoffs of {n} employees in its {product_en} division.",
        "{co_en} cuts {pct} of its workforce in a new round of job cuts.",
        "网传{co}裁员{pct}，公司回应称属于正常人员优化。",
    ),
    "组织关系##加盟": (
        "{person}正式加盟{co}，出任{title}。",
        "前{co}高管{person}加入{co}，负责{dept}。",
        "{person}{date}宣布加盟{team}，双方签约{years}年。",
        "{team}官方宣布，外援{person}加盟球队。",
        "知名主持人{person}加盟{city}卫视，将主持一档新节目。",
        "{co}宣布{person}加入公司董事会，担任{title}。",
        "{person_en} joins {co_en} as its new {title}.",
        "{team_en} completed the signing of {person_en} on a {years}-year deal.",
        "{person}转会加盟{team}，转会费约{amount}。",
    ),
    "组织关系##退出": (
        "{co}{title}{person}因个人原因辞职，即日起生效。",
        "{person}宣布辞去{co}{title}职务，不再担任公司任何职位。",
        "{co}公告称，{title}{person}离任，由{person}接任。",
        "{co}宣布退出{city}市场，关闭全部门店。",
        "{person}卸任{co}法定代表人，持股比例同步下降。",
        "{co_en} {title} {person_en} steps down after {years} years at the company.",
        "{person_en} resigned from the board of {co_en}.",
        "{co}宣布退出行业协会，并终止与{co}的合资协议。",
    ),
    "财经##融资": (
        "{co}完成{round}融资，金额达{amount}，由{investor}领投。",
        "初创公司{co}获得{amount}{round}融资，将用于{product}研发。",
        "{co}宣布完成{amount}融资，{investor}跟投。",
        "{investor}领投{co}{round}，投后估值超{amount}。",
        "{co}{date}获得{investor}战略投资，融资额未披露。",
        "Startup {co_en} raises {usd} in Series B funding led by {investor}.",
        "{co_en} closed a {usd} funding round to expand its {product_en} business.",
        "{city}企业{co}完成{round}融资，募资{amount}。",
    ),
    "财经##上市": (
        "{co}{date}在{exchange}挂牌上市，首日股价上涨{pct}。",
        "{co}正式登陆{exchange}，募资{amount}。",
        "{co}递交招股书，拟在{exchange}IPO。",
        "{co}通过{exchange}上市聆讯，即将敲钟。",
        "{co}IPO获证监会注册批复，计划募资{amount}。",
        "{co_en} went public on the {exchange}, its shares jumping {pct} in early trading.",
        "{co_en} files for an IPO, seeking to raise {usd}.",
        "{co}成功上市，成为{city}今年第{years}家上市公司。",
    ),
    "财经##亏损": (
        "{co}发布财报，{date}净亏损{amount}，同比扩大{pct}。",
        "{co}年报显示全年亏损{amount}，营收下滑{pct}。",
        "受原材料涨价影响，{co}季度由盈转亏，亏损{amount}。",
        "{co}预计上半年亏损{amount}，股价应声下跌{pct}。",
        "{co}连续三年亏损，面临退市风险。",
        "{co_en} reported a quarterly net loss of {usd}, wider than expected.",
        "{co_en} posts a loss as revenue falls {pct}.",
        "{co}{dept}亏损严重，拖累公司整体业绩。",
    ),
    "体育##夺冠": (
        "{team}在{event}决赛中击败{team}，夺得冠军。",
        "{team}{date}捧起{event}冠军奖杯。",
        "{person}在{event}{sport}项目中夺冠，为{city}代表团摘得金牌。",
        "{team}以总比分4比2战胜对手，赢得{event}总冠军。",
        "{person}获得{event}{racket}女子单打冠军，职业生涯首夺大赛金牌。",
        "{team_en} won the {event} title after beating {team_en} in the final.",
        "{person_en} claims the championship at {event}.",
        "时隔{years}年，{team}再次登顶{event}。",
    ),
    "体育##退役": (
        "{team}名宿{person}宣布退役，结束{years}年职业生涯。",
        "{age}岁的{person}{date}宣布挂靴，告别{sport}赛场。",
        "{sport}运动员{person}正式退役，将转型担任教练。",
        "{team}为退役的{person}举行告别仪式，球衣号码将永久退役。",
        "{person}在社交媒体发文宣布退役，感谢球迷{years}年来的支持。",
        "{person_en} announced retirement from professional {sport} at age {age}.",
        "{person_en} retires after {years} seasons with {team_en}.",
    ),
    "体育##受伤": (
        "{team}球员{person}在比赛中{injury}，预计缺阵{weeks}周。",
        "{person}训练中遭遇{injury}，将无缘{event}。",
        "{team}核心{person}确诊{injury}，赛季报销。",
        "{person}在{event}比赛中受伤离场，赛后检查为{injury}。",
        "{sport}名将{person}因{injury}接受手术，康复需要{weeks}周。",
        "{person_en} suffered a {weeks}-week injury and will miss the {event}.",
        "{team_en} star {person_en} is out with an ankle injury.",
        "{team}伤病不断，{person}{injury}后又有主力受伤。",
    ),
    "科技##发布": (
        "{co}{date}发布新一代{product}，售价{n}元起。",
        "{co}召开发布会，推出自研{product}。",
        "{co}正式推出{product}，主打续航与性能。",
        "{co}在{city}举办开发者大会，发布{product}。",
        "{co}新款{product}亮相，支持AI大模型功能。",
        "{co_en} unveiled its new {product_en} at an event in {city}.",
        "{co_en} launches a cheaper {product_en} for emerging markets.",
        "{co}宣布{product}开放公测，首批用户{n}万人。",
    ),
    "科技##数据泄露": (
        "{co}被曝发生数据泄露，约{n}万条用户信息外泄。",
        "黑客入侵{co}服务器，窃取大量用户隐私数据。",
        "{co}承认数据库遭到攻击，用户手机号和住址被泄露。",
        "{co}{date}通报安全事件，部分客户数据被非法访问。",
        "安全研究员发现{co}云存储配置错误，导致{n}万份文件泄露。",
        "{co_en} confirmed a data breach exposing the personal data of {n} thousand users.",
        "Hackers stole customer records from {co_en} in a major data leak.",
        "{co}员工违规导出用户数据，造成信息泄露。",
    ),
    "司法##起诉": (
        "{co}以{dispute}为由起诉{co}，索赔{amount}。",
        "{co}被{co}告上法庭，案由为{dispute}。",
        "{person}向{court}提起诉讼，要求{co}赔偿损失。",
        "{co}起诉前员工{person}违反竞业协议。",
        "{court}已受理{co}诉{co}{dispute}纠纷一案。",
        "{co_en} sued {co_en} over alleged patent infringement.",
        "A class-action lawsuit was filed against {co_en} in {city}.",
        "消费者集体起诉{co}虚假宣传，涉案金额{amount}。",
    ),
    "司法##判决": (
        "{co}原{title}{person}因{crime}被判处有期徒刑{years}年。",
        "{court}一审判决{co}赔偿{co}{amount}。",
        "{court}对{person}{crime}案作出判决，判处其有期徒刑{years}年。",
        "二审维持原判，{co}需支付{amount}违约金。",
        "{person}{crime}一案宣判，法院没收其个人财产{amount}。",
        "A court ordered {co_en} to pay {usd} in damages to {co_en}.",
        "{person_en} was sentenced to {years} years in prison for fraud.",
        "法院判决{co}败诉，须停止{dispute}行为。",
    ),
    "灾害##地震": (
        "{region}发生{mag}级地震，震源深度10千米。",
        "{date}{region}发生{mag}级地震，{city}震感明显。",
        "{region}地震已造成{dead}人遇难，救援工作正在进行。",
        "中国地震台网测定，{region}发生{mag}级地震。",
        "{region}强震后发生多次余震，部分房屋倒塌。",
        "A magnitude {mag} earthquake struck {region}, killing {dead} people.",
        "地震导致{region}多条道路中断，{n}人紧急转移。",
    ),
    "灾害##火灾": (
        "{city}一{place}发生火灾，造成{dead}人死亡。",
        "{city}{place}{date}突发大火，消防员紧急扑救。",
        "{city}某{place}起火，浓烟滚滚，暂无人员伤亡。",
        "{city}一{place}凌晨失火，{n}名居民被疏散。",
        "{co}位于{city}的{place}发生火灾，直接损失约{amount}。",
        "A fire broke out at a {place} in {city}, killing {dead} people.",
        "{city}消防通报：{place}火灾已被扑灭，起火原因正在调查。",
    ),
}

#: Natural two-event sentences (labels from two different branches).
COMBO_TEMPLATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("{co}{date}公布财报，净亏损{amount}，随后宣布裁员{pct}。", ("财经##亏损", "组织关系##裁员")),
    ("因连续亏损{amount}，{co}决定关闭{dept}并裁员{n}人。", ("财经##亏损", "组织关系##裁员")),
    ("{co}上市后首份财报亏损{amount}，股价跌破发行价。", ("财经##上市", "财经##亏损")),
    ("退役后的{person}加盟{co}，出任{title}。", ("体育##退役", "组织关系##加盟")),
    ("{team}夺冠后，主帅{person}宣布辞职离任。", ("体育##夺冠", "组织关系##退出")),
    ("{co}因用户数据泄露被消费者集体起诉，索赔{amount}。", ("科技##数据泄露", "司法##起诉")),
    ("{co}发生数据泄露后，{title}{person}引咎辞职。", ("科技##数据泄露", "组织关系##退出")),
    ("{city}{place}火灾致{dead}人遇难，{co}负责人被判刑{years}年。", ("灾害##火灾", "司法##判决")),
    ("{city}{place}大火后，遇难者家属起诉{co}索赔{amount}。", ("灾害##火灾", "司法##起诉")),
    ("受{region}地震影响，{co}工厂停产，季度亏损{amount}。", ("灾害##地震", "财经##亏损")),
    ("{co}完成{amount}融资后发布首款{product}。", ("财经##融资", "科技##发布")),
    ("{co}在{exchange}上市当天发布新款{product}。", ("财经##上市", "科技##发布")),
    ("{co}发布{product}不到一周，就被{co}起诉{dispute}。", ("科技##发布", "司法##起诉")),
    ("法院判决{co}赔偿{amount}，公司随即宣布裁员{pct}。", ("司法##判决", "组织关系##裁员")),
    ("{person}因{injury}宣布退役，结束{years}年职业生涯。", ("体育##受伤", "体育##退役")),
    ("{co}获{investor}{amount}投资，前{co}高管{person}加盟任{title}。", ("财经##融资", "组织关系##加盟")),
    ("{co_en} laid off {n} staff after reporting a {usd} loss.", ("组织关系##裁员", "财经##亏损")),
    ("{co_en} was sued after a data breach exposed {n} thousand accounts.", ("科技##数据泄露", "司法##起诉")),
    ("{co_en} raised {usd} and launched a new {product_en}.", ("财经##融资", "科技##发布")),
    ("{person_en} retired after winning the {event} title with {team_en}.", ("体育##退役", "体育##夺冠")),
)

#: Connectors for joining two single-event sentences into one two-event text.
CONNECTORS = ("；同时，", "。另外，", "。此外，", "；与此同时，", "。另据报道，", "，")
EN_CONNECTORS = ("Meanwhile,", "Separately,", "In other news,", "Also,")
_LOWER_FIRST_WORDS = {"A", "Startup", "Hackers"}
#: Share of English templates (the rest is Chinese, often mixed with English names).
ENGLISH_SHARE = 0.15

_SLOT_RE = re.compile(r"\{(\w+)\}")


def fill(template: str, rng: random.Random) -> str:
    """Fill every ``{slot}``; a slot named twice (``{co}`` sues ``{co}``) gets two different values."""
    used: dict[str, set[str]] = {}

    def draw(m: re.Match[str]) -> str:
        name = m.group(1)
        taken = used.setdefault(name, set())
        value = SLOTS[name](rng)
        for _ in range(20):
            if value not in taken:
                break
            value = SLOTS[name](rng)
        taken.add(value)
        return value

    return _SLOT_RE.sub(draw, template)


def with_parents(leaves: tuple[str, ...] | list[str]) -> list[str]:
    """Leaves plus their parents, in ``LABELS`` order (every child implies its parent)."""
    wanted = set(leaves) | {leaf.split("##")[0] for leaf in leaves}
    return [label for label in LABELS if label in wanted]


def _branch(leaf: str) -> str:
    return leaf.split("##")[0]


def _is_english(template: str) -> bool:
    """No CJK outside the ``{slots}`` (the slots may still put Chinese names in: mixed zh-en)."""
    return not any("\u4e00" <= ch <= "\u9fff" for ch in _SLOT_RE.sub("", template))


def _template(leaf: str, rng: random.Random, english: bool | None = None) -> str:
    """A template for ``leaf``; English ones are drawn with probability ``ENGLISH_SHARE``."""
    if english is None:
        english = rng.random() < ENGLISH_SHARE
    pool = [t for t in TEMPLATES[leaf] if _is_english(t) == english]
    return rng.choice(pool)


def _single(rng: random.Random) -> tuple[str, list[str]]:
    leaf = rng.choice(LEAVES)
    return fill(_template(leaf, rng), rng), with_parents([leaf])


def _joined(rng: random.Random) -> tuple[str, list[str]]:
    """Two single-event sentences from different branches, joined (both Chinese or both English)."""
    first = rng.choice(LEAVES)
    second = rng.choice([leaf for leaf in LEAVES if _branch(leaf) != _branch(first)])
    english = rng.random() < ENGLISH_SHARE
    s1, s2 = fill(_template(first, rng, english), rng), fill(_template(second, rng, english), rng)
    if english:
        if s2.split(" ", 1)[0] in _LOWER_FIRST_WORDS:
            s2 = s2[0].lower() + s2[1:]
        text = f"{s1} {rng.choice(EN_CONNECTORS)} {s2}"
    else:
        text = s1[:-1] + rng.choice(CONNECTORS) + s2
    return text, with_parents([first, second])


def _combo(rng: random.Random) -> tuple[str, list[str]]:
    template, leaves = rng.choice(COMBO_TEMPLATES)
    return fill(template, rng), with_parents(list(leaves))


def generate(seed: int = SEED, sizes: dict[str, int] = SPLIT_SIZES) -> dict[str, list[dict]]:
    """All splits as ``{"train": [{"text", "labels"}, ...], ...}``; unique texts, deterministic."""
    rng = random.Random(seed)
    total = sum(sizes.values())
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < total:
        r = rng.random()
        text, labels = _combo(rng) if r < TWO_EVENT_SHARE / 2 else _joined(rng) if r < TWO_EVENT_SHARE else _single(rng)
        if text in seen or len(text) > MAX_CHARS:
            continue
        seen.add(text)
        rows.append({"text": text, "labels": labels})
    rng.shuffle(rows)
    out: dict[str, list[dict]] = {}
    start = 0
    for name in SPLITS:
        out[name] = rows[start : start + sizes[name]]
        start += sizes[name]
    return out


def dumps(rows: list[dict]) -> str:
    """One JSON object per line, UTF-8 as-is, ``\\n`` endings: stable bytes for versioning."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_dataset(out_dir: Path = DATA_DIR, seed: int = SEED) -> dict[str, Path]:
    """Write ``{train,dev,test}.jsonl`` into ``out_dir``; returns split -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, rows in generate(seed).items():
        path = out_dir / f"{name}.jsonl"
        path.write_bytes(dumps(rows).encode("utf-8"))
        paths[name] = path
        log.info("wrote %d rows to %s", len(rows), path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="output directory (default: package data)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_dataset(args.out)


if __name__ == "__main__":
    main()
