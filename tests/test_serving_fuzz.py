"""Hostile traffic on a real Triton: one bad request fails only itself, and the server never notices.

One module-scoped local Triton; the session's tiny checkpoint is released to it once. Four client
threads (four requests in flight each) then send 1,000 seeded requests — random bytes, invalid
UTF-8, texts over the byte limit, empty strings and batches, wrong dtypes, shapes and names,
oversized batches, texts that tokenize far past ``max_length``, only control / special / NUL
characters, ids the model's embeddings cannot index sent straight to the composing models —
interleaved with the validated golden texts, single and batched (and their ids straight to the
model), so that Triton's dynamic batchers mix good and bad requests in one ``execute``. Every good
answer must equal ``parity/expected.json``; every hostile request gets ``INVALID_ARGUMENT`` naming
the reason (benign-but-odd texts a well-formed answer); nothing hangs; at the end the same models
are loaded and ready, no python stub restarted (same pids) and the log shows no stub trouble or
traceback.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from seqcls.contract import shipped
from seqcls.contract.names import CLASSIC
from seqcls.localtriton import LocalTriton, TritonServerConfig, free_ports
from seqcls.release.intake import open_release
from seqcls.release.records import Expected, ExpectedItem
from seqcls.settings import PROJECT_ROOT, Settings
from seqcls.steps import run_release

pytestmark = [pytest.mark.slow, pytest.mark.integration]

TOTAL, THREADS, SEED = 1000, 4, 13
TIMEOUT_S = 30.0  # per request: a hang is a DEADLINE_EXCEEDED, never a stuck test
BURST = 4  # requests each thread has in flight at once (async): up to 16 for the dynamic batchers to mix
ARTIFACT = PROJECT_ROOT / "var" / "test-artifacts" / "serving-fuzz.json"
#: What the Triton log must never say during the fuzz: a stub that died, was restarted or hung, or a python
#: traceback (an exception the models did not anticipate; they log those). At --log-verbose=0 Triton does not
#: log a stub's death itself, which is why the stubs' pids are compared too.
STUB_TROUBLE = re.compile(
    r"(?i)not healthy|unhealthy|stub.*(restart|crash|terminat|killed|exit)|segmentation|signal \d|traceback"
)
LIMIT = shipped.contract().MAX_TEXT_BYTES
TOKENIZER_KINDS = ("random-bytes", "invalid-utf8", "over-byte-limit", "over-byte-limit-in-batch")
MODEL_KINDS = ("model-id-over-vocab", "model-negative-id", "model-type-id")


@dataclass
class Served:
    server: LocalTriton
    settings: Settings
    expected: Expected
    vocab_size: int
    max_positions: int
    ids: list[list[int]]  # the serving tokenizer's ids of each golden text (expected.items order)


@dataclass(frozen=True)
class Request:
    model: str
    inputs: tuple

    def infer(self, client):
        return client.infer(self.model, list(self.inputs), client_timeout=TIMEOUT_S)


@dataclass
class Case:
    kind: str
    request: Request
    expect: str  # "golden" (as validated) | "logits" (golden ids, as validated) | "answer" (well-formed) | "error"
    golden: list[ExpectedItem] = field(default_factory=list)
    texts: int = 1
    reason: str = ""  # a fragment the error message must contain


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint_src: Path) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("fuzz")
    http, grpc, metrics = free_ports(3)
    server = LocalTriton(
        TritonServerConfig(
            repository=root / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics, state_dir=root / "state"
        )
    )
    server.start()
    try:
        settings = Settings(
            home=root / "home",
            triton_repository=server.config.repository,
            triton_grpc=(server.config.grpc_url,),
            triton_http=(server.config.http_url,),
            mlflow_tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
        )
        release = open_release(tiny_checkpoint_src, settings=settings)
        run_release(release)
        expected = Expected.load(release.workspace)
        text = shipped.text(settings)
        tokenizer = text.build_tokenizer(
            release.checkpoint.vocab_file, lowercase=release.checkpoint.do_lower_case, max_length=expected.max_length
        )
        ids = text.encode(tokenizer, [item.text for item in expected.items])
        ckpt = release.checkpoint
        yield Served(server, settings, expected, ckpt.vocab_size, ckpt.max_position_embeddings, ids)
    finally:
        server.stop()


def _client(served: Served):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(url=served.server.config.grpc_url)


def _text_input(data: np.ndarray, dtype: str = "BYTES", name: str = "TEXT", shape: list[int] | None = None):
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput(name, list(data.shape), dtype)
    inp.set_data_from_numpy(data)
    if shape is not None:  # declared shape that does not match the data sent
        inp.set_shape(shape)
    return inp


def _send(model: str, *inputs) -> Request:
    return Request(model, inputs)


def _texts(items: list[bytes], **kw) -> Request:
    return _send(CLASSIC.ensemble, _text_input(np.array(items, dtype=object).reshape(len(items), 1), **kw))


def _ids(model: str, ids: np.ndarray, types: np.ndarray | None = None) -> Request:
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, a in (("input_ids", ids), ("token_type_ids", np.zeros_like(ids) if types is None else types)):
        inp = grpcclient.InferInput(name, list(a.shape), "INT64")
        inp.set_data_from_numpy(a.astype(np.int64))
        inputs.append(inp)
    return _send(model, *inputs)


def _odd_text(rng: random.Random) -> bytes:
    """Valid UTF-8 under the limit that tokenizes to little or nothing, or far past max_length."""
    choices = [
        "",
        "\x00" * rng.randint(1, 50),
        "".join(chr(rng.randint(1, 31)) for _ in range(rng.randint(1, 40))),
        "\u200b\u200d\ufeff\u202e\u2066" * rng.randint(1, 10),  # zero-width, BOM, bidi controls
        "[CLS][SEP][PAD][UNK][MASK]" * rng.randint(1, 5),
        " \t\r\n\u3000" * rng.randint(1, 30),
        "!@#$%^&*()_+{}|:<>?~`" * rng.randint(1, 20),
        "\U0001f600\U0001f680\u00a9\u20ac" * rng.randint(1, 50),  # emoji and symbols
        "e\u0301\u0308\u0327" * rng.randint(1, 50),  # combining marks
        "\ufffd\U000e0001\U0010fffd" * rng.randint(1, 20),  # replacement char, tags, private use
        "公司宣布裁员。" * rng.randint(60, 400),  # hundreds of tokens: truncated to max_length
        "a" * rng.randint(101, 5000),  # one word over 100 characters → [UNK]
        "word " * rng.randint(200, 2000),
    ]
    return rng.choice(choices).encode("utf-8")


def _random_bytes(rng: random.Random) -> Case:
    data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
    try:
        data.decode("utf-8")
        return Case("random-bytes", _texts([data]), "answer")  # happened to be valid UTF-8
    except UnicodeDecodeError:
        return Case("random-bytes", _texts([data]), "error", reason="not valid UTF-8")


def _invalid_utf8(rng: random.Random, goldens: list[ExpectedItem]) -> Case:
    bad = rng.choice([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", "公".encode()[:2], b"\xf8\x88\x80\x80\x80", b"\x80"])
    good = [g.text.encode() for g in rng.sample(goldens, rng.randint(0, 3))]
    items = [*good, rng.choice(goldens).text[:3].encode() + bad]  # whole characters, then the bad bytes
    rng.shuffle(items)
    return Case("invalid-utf8", _texts(items), "error", reason="not valid UTF-8")


def _hostile(rng: random.Random, served: Served, goldens: list[ExpectedItem]) -> Case:
    num_labels = len(served.expected.labels)
    one = np.array([[b"ok"]], dtype=object)
    kinds: dict[str, Callable[[], Case]] = {
        "random-bytes": lambda: _random_bytes(rng),
        "invalid-utf8": lambda: _invalid_utf8(rng, goldens),
        "over-byte-limit": lambda: Case(
            "over-byte-limit",
            _texts([("公" * (LIMIT // 3 + rng.randint(1, 40_000))).encode()]),
            "error",
            reason="max_text_bytes",
        ),
        "over-byte-limit-in-batch": lambda: Case(
            "over-byte-limit-in-batch",
            _texts([goldens[0].text.encode(), b"x" * (LIMIT + 1)]),
            "error",
            reason="text 1 is 65537 bytes",
        ),
        "empty-batch": lambda: Case("empty-batch", _texts([]), "error", reason="TEXT"),
        "wrong-dtype": lambda: Case(
            "wrong-dtype",
            _send(
                CLASSIC.ensemble,
                _text_input(
                    *rng.choice([(np.zeros((1, 1), np.int32), "INT32"), (np.ones((2, 1), np.float32), "FP32")])
                ),
            ),
            "error",
            reason="data-type",
        ),
        "wrong-shape": lambda: Case(
            "wrong-shape",
            _send(CLASSIC.ensemble, _text_input(rng.choice([np.array([[b"a", b"b"]], dtype=object), one.reshape(1)]))),
            "error",
            reason="shape",
        ),
        "shape-data-mismatch": lambda: Case(
            "shape-data-mismatch",
            _send(CLASSIC.ensemble, _text_input(np.array([[b"a"], [b"b"]], dtype=object), shape=[1, 1])),
            "error",
            reason="string elements",
        ),
        "no-inputs": lambda: Case("no-inputs", _send(CLASSIC.ensemble), "error", reason="missing required input"),
        "wrong-name": lambda: Case("wrong-name", _send(CLASSIC.ensemble, _text_input(one, name="text")), "error"),
        "batch-too-big": lambda: Case("batch-too-big", _texts([b"t"] * 65), "error", reason="batch-size"),
        "model-too-long": lambda: Case(
            "model-too-long",
            _ids(CLASSIC.model, np.ones((1, served.max_positions + rng.randint(1, 400)))),
            "error",
            reason=f"max_position_embeddings {served.max_positions}",
        ),
        "model-shape-mismatch": lambda: Case(
            "model-shape-mismatch",
            _ids(CLASSIC.model, np.ones((1, 4)), np.zeros((1, 5))),
            "error",
            reason="of the same shape",
        ),
        **{kind: (lambda kind=kind: _poisoned_ids(rng, served, kind)) for kind in MODEL_KINDS},
        "postprocess-wrong-width": lambda: Case(
            "postprocess-wrong-width",
            _send(CLASSIC.postprocess, _logits(np.zeros((1, num_labels + 3), np.float32))),
            "error",
            reason=f"expected [N, {num_labels}]",
        ),
    }
    # the kinds that share dynamic batches with good traffic weigh more: every text reaches the tokenizer,
    # while seqcls_model's batcher only merges requests of one sequence length
    weights = [3 if k in TOKENIZER_KINDS else 2 if k in MODEL_KINDS else 1 for k in sorted(kinds)]
    return kinds[rng.choices(sorted(kinds), weights)[0]]()


def _one_length(served: Served) -> list[int]:
    """Golden texts whose ids all have the most common length: seqcls_model's batcher merges only those."""
    length = Counter(len(x) for x in served.ids).most_common(1)[0][0]
    return [i for i, x in enumerate(served.ids) if len(x) == length]


def _poisoned_ids(rng: random.Random, served: Served, kind: str) -> Case:
    """A golden text's ids (so the model's batcher can merge it with good requests) with one bad value."""
    ids = np.array([served.ids[rng.choice(_one_length(served))]])
    types = np.zeros_like(ids)
    at = rng.randrange(ids.shape[1])
    if kind == "model-id-over-vocab":
        ids[0, at] = rng.randint(served.vocab_size, 10 * served.vocab_size)
        reason = f"input_ids must lie in [0, {served.vocab_size})"
    elif kind == "model-negative-id":
        ids[0, at], reason = -rng.randint(1, 5), "input_ids must lie in [0, "
    else:
        types[0, at], reason = rng.randint(4, 99), "token_type_ids must lie in [0, 4)"
    return Case(kind, _ids(CLASSIC.model, ids, types), "error", reason=reason)


def _logits(a: np.ndarray):
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("logits", list(a.shape), "FP32")
    inp.set_data_from_numpy(a)
    return inp


def _cases(served: Served) -> list[Case]:
    rng = random.Random(SEED)
    goldens = list(served.expected.items)
    cases: list[Case] = []
    for _ in range(TOTAL):
        roll = rng.random()
        if roll < 0.25:
            g = [rng.choice(goldens)]
            cases.append(Case("golden-single", _texts([g[0].text.encode()]), "golden", g))
        elif roll < 0.40:
            g = rng.sample(goldens, rng.randint(2, 8))
            cases.append(Case("golden-batch", _texts([x.text.encode() for x in g]), "golden", g, len(g)))
        elif roll < 0.47:
            i = rng.choice(_one_length(served))
            ids = _ids(CLASSIC.model, np.array([served.ids[i]]))
            cases.append(Case("golden-ids-to-model", ids, "logits", [goldens[i]]))
        elif roll < 0.57:
            texts = [_odd_text(rng) for _ in range(rng.randint(1, 4))]
            cases.append(Case("odd-but-valid", _texts(texts), "answer", texts=len(texts)))
        else:
            cases.append(_hostile(rng, served, goldens))
    cases.append(Case("at-byte-limit", _texts([b"a" * LIMIT, b""]), "answer", texts=2))
    return cases


def _check(case: Case, outcome: object, labels: list[str], prob_atol: float) -> str | None:
    """Why this outcome is wrong for this case, or None."""
    from tritonclient.utils import InferenceServerException

    if outcome is None:
        return f"{case.kind}: no answer within {TIMEOUT_S} s"
    if isinstance(outcome, InferenceServerException):
        if case.expect != "error":
            return f"{case.kind}: unexpected error {outcome.status()}: {outcome.message()[:200]}"
        if outcome.status() != "StatusCode.INVALID_ARGUMENT":
            return f"{case.kind}: status {outcome.status()} (expected INVALID_ARGUMENT): {outcome.message()[:200]}"
        if case.reason not in (outcome.message() or ""):
            return f"{case.kind}: message {outcome.message()[:200]!r} lacks {case.reason!r}"
        return None
    if isinstance(outcome, BaseException):
        return f"{case.kind}: {type(outcome).__name__}: {outcome}"
    if case.expect == "error":
        return f"{case.kind}: answered, expected an error"
    if case.expect == "logits":
        probs = 1.0 / (1.0 + np.exp(-outcome.as_numpy("logits").astype(np.float64)))
        diff = float(np.abs(np.asarray(case.golden[0].probabilities) - probs[0]).max())
        return None if probs.shape[0] == 1 and diff <= prob_atol else f"{case.kind}: max |Δp| {diff:.2g}"
    preds = [json.loads(row[0]) for row in outcome.as_numpy("predictions")]
    probs = outcome.as_numpy("probabilities")
    if len(preds) != case.texts or probs.shape != (case.texts, len(labels)) or not np.isfinite(probs).all():
        return f"{case.kind}: malformed answer ({len(preds)} predictions, probabilities {probs.shape})"
    for pred in preds:
        if not all(p["label"] in labels and 0.0 <= p["confidence"] <= 1.0 for p in pred):
            return f"{case.kind}: malformed prediction {pred}"
    for item, pred, p in zip(case.golden, preds, probs, strict=False):
        got = sorted(x["label"] for x in pred)
        diff = float(np.abs(np.asarray(item.probabilities, dtype=np.float32) - p).max())
        if got != sorted(item.labels) or diff > prob_atol:
            return f"{case.kind}: {item.text[:40]!r} answered {got} (max |Δp| {diff:.2g}), validated {item.labels}"
    return None


def _control_headers(served: Served) -> dict[str, str] | None:
    """What a model-repository call sends: the Triton control key, where seqcls restricts those APIs."""
    try:
        from seqcls.settings import control_headers
    except ImportError:  # a seqcls whose Tritons do not restrict model control
        return None
    return control_headers(served.settings.control_key())


def _index(served: Served) -> dict[tuple[str, str], str]:
    index = _client(served).get_model_repository_index(headers=_control_headers(served))
    return {(m.name, m.version): m.state for m in index.models}


def _stubs(served: Served) -> dict[int, str]:
    """The python backend stub processes (pid → command line): a restarted stub has a new pid."""
    import psutil

    proc = psutil.Process(served.server.status().pid)
    return {p.pid: " ".join(p.cmdline()[1:3]) for p in proc.children(recursive=True)}


def _settled_stubs(served: Served, quiet_s: float = 2.0, timeout_s: float = 60.0) -> dict[int, str]:
    """The stubs once the release's last reload is over (a replaced instance's stub exits a moment later)."""
    deadline, stubs, since = time.monotonic() + timeout_s, _stubs(served), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _stubs(served)
        if now != stubs:
            stubs, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return stubs
    raise AssertionError(f"python backend stubs kept changing for {timeout_s} s: {stubs}")


def test_hostile_traffic_fails_only_the_hostile_requests(served: Served) -> None:
    cases = _cases(served)
    labels, tol = list(served.expected.labels), float(served.expected.prob_atol)
    index_before, stubs_before = _index(served), _settled_stubs(served)
    log_start = served.server.log_path.stat().st_size
    assert stubs_before and all(state == "READY" for state in index_before.values()), index_before
    outcomes: list[object] = [None] * len(cases)
    seconds: list[float] = [0.0] * len(cases)

    def worker(offset: int) -> None:
        client = _client(served)
        mine = list(range(offset, len(cases), THREADS))
        for start in range(0, len(mine), BURST):
            burst, done = mine[start : start + BURST], threading.Semaphore(0)
            for i in burst:
                sent = time.perf_counter()

                def callback(result, error, i=i, sent=sent, done=done) -> None:
                    outcomes[i] = error if error is not None else result  # judged below, with its case
                    seconds[i] = time.perf_counter() - sent
                    done.release()

                try:
                    request = cases[i].request
                    client.async_infer(request.model, list(request.inputs), callback, client_timeout=TIMEOUT_S)
                except Exception as exc:  # refused by the client library itself
                    outcomes[i] = exc
                    done.release()
            for _ in burst:
                done.acquire(timeout=TIMEOUT_S + 10)  # a request still unanswered stays None: a hang

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT_S * len(cases) / THREADS)
    elapsed = time.perf_counter() - t0
    assert not any(t.is_alive() for t in threads), "a client thread is stuck"

    judged = [(c, _check(c, o, labels, tol)) for c, o in zip(cases, outcomes, strict=True)]
    problems = [p for _, p in judged if p]
    good_failed = sum(1 for c, p in judged if p and c.expect != "error")
    counts = Counter((c.kind, c.expect) for c in cases)
    errors = sum(1 for c in cases if c.expect == "error")
    summary = {
        "requests": len(cases),
        "threads": THREADS,
        "golden": sum(1 for c in cases if c.expect in ("golden", "logits")),
        "odd_but_valid": sum(1 for c in cases if c.expect == "answer"),
        "hostile": errors,
        "kinds": {f"{k} ({e})": n for (k, e), n in sorted(counts.items())},
        "seconds": round(elapsed, 1),
        "slowest_request_s": round(max(seconds), 2),
        "good_answered_wrongly": good_failed,
        "problems": problems[:20],
    }
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8")
    print(f"\nserving fuzz: {json.dumps(summary, ensure_ascii=False)}")
    assert not problems, (
        f"{len(problems)} of {len(cases)} requests answered wrongly ({good_failed} good ones): {problems[:5]}"
    )
    assert summary["golden"] > 200 and errors > 300 and len(counts) > 20, summary

    client = _client(served)
    assert client.is_server_live() and client.is_server_ready()
    assert _index(served) == index_before, "the loaded models changed"
    assert _stubs(served) == stubs_before, "a python backend stub was restarted"
    with served.server.log_path.open("rb") as fh:
        fh.seek(log_start)
        log = fh.read().decode("utf-8", errors="replace")
    assert not STUB_TROUBLE.search(log), STUB_TROUBLE.search(log)
    item = served.expected.items[0]
    after = Case("after", _texts([item.text.encode()]), "golden", [item])
    assert _check(after, after.request.infer(client), labels, tol) is None
