"""The demo dataset's slot vocabularies: what fills a template's ``{slot}`` (companies, people, cities...).

:data:`SLOTS` maps each slot name to a function drawing one value from a ``random.Random``; the
templates live in :mod:`seqcls_tools.demo.make_dataset`. Changing anything here changes the
generated data (the committed ``data/*.jsonl`` would no longer be rewritten byte-identically).
"""

from __future__ import annotations

import random
from collections.abc import Callable

# fmt: off
COMPANIES_ZH = (
    "华腾科技", "星河集团", "蓝海电子", "瑞丰银行", "远景汽车", "云帆网络", "天启医药", "金桥地产",
    "北辰物流", "光合新能源", "青藤教育", "恒通证券", "万象传媒", "鼎盛食品", "赛博智能", "中原钢铁",
    "凌云航空", "新禾农业", "锐思半导体", "泰和保险", "东方影业", "极光游戏", "长风电气", "安澜化工",
    "聚力零售", "海纳软件", "启明芯片", "鸿运快递", "嘉禾酒业", "曙光机器人", "百川数据", "盛世文旅",
    "宏图建设", "同舟制药", "墨子量子", "橙子出行", "晨星乳业", "银杏健康", "飞鱼电商", "正阳纺织",
)
COMPANIES_EN = (
    "Tesla", "Google", "Amazon", "Intel", "Nvidia", "Uber", "Spotify", "Netflix", "Oracle", "Shopify",
    "Stripe", "Airbnb", "Zoom", "Dell", "Salesforce", "Qualcomm", "OpenAI", "Siemens", "Nokia", "Pfizer",
)
SURNAMES = "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾萧田董潘袁蔡蒋余于杜叶程"
GIVEN = (
    "伟", "芳", "静", "强", "磊", "洋", "艳", "勇", "军", "杰", "涛", "明", "超", "秀英", "建华", "志强",
    "晓东", "海燕", "国庆", "雪梅", "子轩", "思远", "一鸣", "宇航", "梦琪", "浩然", "佳怡", "文博",
)
PEOPLE_EN = (
    "John Smith", "Emma Brown", "David Lee", "Sarah Miller", "Michael Chen", "Laura Garcia", "James Wilson",
    "Anna Kowalski", "Tom Becker", "Maria Rossi", "Kevin Park", "Olivia Martin",
)
TITLES = (
    "董事长", "总裁", "首席执行官", "CEO", "CTO", "首席财务官", "副总裁", "总经理", "首席科学家", "独立董事",
)
CITIES = (
    "北京", "上海", "广州", "深圳", "杭州", "成都", "武汉", "南京", "西安", "重庆", "苏州", "天津", "长沙",
    "郑州", "青岛", "厦门", "昆明", "合肥", "大连", "沈阳", "福州", "济南", "哈尔滨", "兰州", "乌鲁木齐",
    "拉萨", "南宁", "贵阳", "海口", "宁波",
)
REGIONS = ("四川", "云南", "甘肃", "青海", "新疆", "西藏", "台湾", "日本", "土耳其", "印尼", "智利", "墨西哥")
TEAMS = (
    "广州队", "上海海港", "北京国安", "山东泰山", "成都蓉城", "浙江队", "辽宁男篮", "广东宏远", "新疆广汇",
    "皇家马德里", "巴塞罗那", "曼城", "利物浦", "拜仁慕尼黑", "湖人队", "勇士队", "中国女排", "中国乒乓球队",
    "凯尔特人", "尤文图斯",
)
TEAMS_EN = ("Manchester City", "Real Madrid", "the Lakers", "the Warriors", "Bayern Munich", "Liverpool")
EVENTS = (
    "中超联赛", "CBA总决赛", "欧冠", "世锦赛", "亚洲杯", "全运会", "NBA总决赛", "世界杯预选赛", "全国锦标赛",
    "奥运会", "温网", "环法自行车赛", "城市马拉松", "亚运会",
)
SPORTS = ("足球", "篮球", "排球", "乒乓球", "羽毛球", "网球", "游泳", "田径", "跳水", "体操")
INJURIES = ("膝伤", "脚踝扭伤", "腿筋拉伤", "十字韧带断裂", "肩部脱臼", "跟腱撕裂", "腰伤", "骨折", "脑震荡")
PRODUCTS = (
    "智能手机", "折叠屏手机", "AI芯片", "智能手表", "电动汽车", "大语言模型", "操作系统", "无人机", "VR头显",
    "扫地机器人", "云服务平台", "自动驾驶系统", "笔记本电脑", "智能音箱", "5G基站",
)
PRODUCTS_EN = (
    "smartphone", "AI chip", "smartwatch", "electric SUV", "language model", "laptop", "VR headset",
)
DEPARTMENTS = (
    "研发部门", "销售团队", "海外业务", "客服中心", "市场部", "制造工厂", "总部职能部门", "游戏工作室",
)
ROUNDS = ("天使轮", "Pre-A轮", "A轮", "B轮", "C轮", "D轮", "战略", "新一轮", "B+轮")
INVESTORS = (
    "红杉资本", "高瓴资本", "IDG资本", "腾讯投资", "深创投", "经纬创投", "软银", "启明创投", "国投创新",
)
EXCHANGES = ("上交所科创板", "深交所创业板", "港交所", "纳斯达克", "纽交所", "北交所")
COURTS = ("人民法院", "中级人民法院", "高级人民法院", "知识产权法院", "互联网法院")
CRIMES = ("受贿罪", "诈骗罪", "职务侵占罪", "内幕交易罪", "非法吸收公众存款罪", "挪用资金罪", "行贿罪")
DISPUTES = ("专利侵权", "合同违约", "不正当竞争", "商标侵权", "劳动纠纷", "虚假宣传", "垄断")
PLACES = ("仓库", "化工厂", "居民楼", "商场", "写字楼", "餐馆", "厂房", "仓储中心", "宿舍楼", "农贸市场")
DATES = (
    "近日", "昨日", "今日", "本周一", "本周三", "上周五", "日前", "周末", "今年一季度", "当地时间周二",
    "3月15日", "5月8日", "7月21日", "9月30日", "11月11日", "12月2日", "2023年底", "2024年初",
)
# fmt: on


def _amount(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return f"{rng.choice((300, 500, 800, 2000, 5000))}万元"
    n = rng.choice((1.2, 2, 3.5, 5, 8, 10, 12, 15, 20, 30, 45, 50, 80, 100, 120, 300))
    return f"{n:g}{rng.choice(('亿元', '亿元', '亿美元'))}"


def _person(rng: random.Random) -> str:
    return rng.choice(SURNAMES) + rng.choice(GIVEN)


SLOTS: dict[str, Callable[[random.Random], str]] = {
    "co": lambda r: r.choice(COMPANIES_ZH) if r.random() < 0.8 else r.choice(COMPANIES_EN),
    "co_en": lambda r: r.choice(COMPANIES_EN),
    "person": _person,
    "person_en": lambda r: r.choice(PEOPLE_EN),
    "title": lambda r: r.choice(TITLES),
    "city": lambda r: r.choice(CITIES),
    "region": lambda r: r.choice(REGIONS),
    "team": lambda r: r.choice(TEAMS),
    "team_en": lambda r: r.choice(TEAMS_EN),
    "event": lambda r: r.choice(EVENTS),
    "sport": lambda r: r.choice(SPORTS),
    "racket": lambda r: r.choice(("乒乓球", "羽毛球", "网球")),
    "injury": lambda r: r.choice(INJURIES),
    "product": lambda r: r.choice(PRODUCTS),
    "product_en": lambda r: r.choice(PRODUCTS_EN),
    "dept": lambda r: r.choice(DEPARTMENTS),
    "round": lambda r: r.choice(ROUNDS),
    "investor": lambda r: r.choice(INVESTORS),
    "exchange": lambda r: r.choice(EXCHANGES),
    "court": lambda r: r.choice(CITIES) + r.choice(COURTS),
    "crime": lambda r: r.choice(CRIMES),
    "dispute": lambda r: r.choice(DISPUTES),
    "place": lambda r: r.choice(PLACES),
    "date": lambda r: r.choice(DATES),
    "amount": _amount,
    "usd": lambda r: f"${r.choice((5, 12, 20, 35, 50, 80, 150, 400))}M",
    "pct": lambda r: f"{r.choice((3, 5, 8, 10, 12, 15, 20, 25, 30))}%",
    "n": lambda r: str(r.choice((50, 120, 200, 300, 500, 800, 1200, 2000, 3000, 6000))),
    "mag": lambda r: f"{r.choice((4.6, 5.1, 5.5, 5.8, 6.2, 6.4, 6.9, 7.1, 7.4, 7.8))}",
    "years": lambda r: str(r.choice((2, 3, 5, 7, 8, 10, 12, 15))),
    "age": lambda r: str(r.choice((29, 31, 32, 33, 34, 35, 36, 38))),
    "weeks": lambda r: str(r.choice((2, 3, 4, 6, 8, 12))),
    "dead": lambda r: str(r.choice((2, 3, 4, 5, 7, 12, 18))),
}
