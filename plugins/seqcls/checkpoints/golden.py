"""The built-in golden texts: used when a checkpoint ships no ``golden.txt``.

Varied on purpose — the parity gate is only as good as the inputs it sees: Chinese, English,
mixed scripts, digits, punctuation (full- and half-width), emoji, accents, a single character,
whitespace oddities and texts far longer than any ``max_length`` (truncation must agree too).
:func:`golden_texts` is the one choice between a checkpoint's own and these (validate gates on
them and records the answers smoke expects, convert calibrates ``int8`` on them).
"""

from __future__ import annotations

from seqcls.checkpoints.checkpoint import Checkpoint

_ZH = (
    "某科技公司宣布裁员百分之十，涉及研发和销售部门。",
    "受市场下行影响，这家互联网企业今年第二次裁员。",
    "知名主持人正式加盟省级卫视，将主持一档新节目。",
    "球队在总决赛中以四比二击败对手，时隔十年再度夺冠。",
    "初创企业完成B轮融资，金额超过三亿元人民币。",
    "央行宣布下调存款准备金率零点五个百分点。",
    "新能源汽车销量连续三个月同比增长超过百分之五十。",
    "公司董事长因个人原因辞职，副总裁暂代其职务。",
    "两家物流企业宣布合并，新公司将在明年上市。",
    "国家队主教练公布了亚洲杯的最终参赛名单。",
    "暴雨导致城市多条道路积水，地铁部分线路停运。",
    "这款手机搭载了最新的芯片，续航时间明显提升。",
    "研究团队在量子计算领域取得重要突破。",
    "电影首映当天票房突破两亿元，创下同类影片纪录。",
    "游泳名将在世锦赛上打破亚洲纪录，获得金牌。",
    "银行下调了房贷利率，购房者的月供有所减少。",
    "该公司因财务造假被证监会立案调查。",
    "员工反映加班严重，公司承诺改善工作环境。",
    "今天天气晴朗，适合外出散步。",
    "我们明天上午十点在会议室讨论项目进度。",
)
_EN = (
    "The company announced layoffs affecting 1,200 employees worldwide.",
    "Startup raises $45 million in a Series C round led by venture investors.",
    "The home team won the championship after a dramatic overtime victory.",
    "Famous striker joins the club on a five-year contract.",
    "Central bank cuts interest rates by 25 basis points.",
    "Quarterly revenue beat expectations, shares rose 8% after hours.",
    "The CEO resigned amid an accounting scandal.",
    "Heavy rain disrupted traffic across the city on Monday morning.",
    "NEW PHONE LAUNCH: BATTERY LIFE UP 30 PERCENT!!!",
    "the quick brown fox jumps over the lazy dog",
)
_MIXED = (
    "Apple公司发布新款iPhone，售价5999元起。",
    "OpenAI完成新一轮融资，估值超过800亿美元。",
    "NBA总决赛G7：勇士队夺冠，Curry获得FMVP。",
    "公司宣布layoff计划，约300名employees受影响。",
    "iPhone 16 Pro Max 256GB 售价 ¥9999",
    "AI芯片startup获得Series A funding 5000万美元",
    "CPI同比上涨2.1%，PPI环比下降0.3%。",
    "COVID-19疫情后，remote work成为新常态。",
)
_EDGE = (
    "裁",
    "a",
    "7",
    "！",
    "😀",
    "今天很开心😀🎉，我们夺冠了🏆！",
    "🚀🚀🚀 To the moon 🌕",
    "1234567890",
    "2024-06-18 12:30:45",
    "+86 138-0013-8000",
    "￥1,000,000.00 / $3.5B / €20k",
    "……！？；：“”‘’（）【】《》",
    "!!!???...,,,;;;",
    "Café naïve résumé — Ünïcödé àccents",
    "ＦＵＬＬ－ＷＩＤＴＨ　全角字符　１２３",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\ninside",
    "混合 English 中文 1234 ！@#￥%……&*（）",
    "ТЕСТ на русском языке",
    "한국어 텍스트와 日本語のテキスト",
    "http://example.com/path?query=1&b=2 联系 admin@example.com",
    "<html><body>标签</body></html>",
    "supercalifragilisticexpialidocious" * 4,
)
_LONG = (
    "公司宣布裁员。" * 60,
    "The team won the championship again and again. " * 30,
    "".join(f"第{i}条新闻：某公司完成融资，球队夺冠，员工裁员。" for i in range(40)),
    ("这是一段很长的文本，用来测试截断是否一致。" * 20) + "最后的结尾部分不会被模型看到。",
)

DEFAULT_GOLDEN_TEXTS: tuple[str, ...] = _ZH + _EN + _MIXED + _EDGE + _LONG


def golden_texts(ckpt: Checkpoint) -> tuple[list[str], str]:
    """The texts a release of ``ckpt`` is gated on, and where they come from."""
    if ckpt.golden_texts:
        return list(ckpt.golden_texts), "checkpoint golden.txt"
    return list(DEFAULT_GOLDEN_TEXTS), "built-in golden set"
