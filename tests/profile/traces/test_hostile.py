"""Hostile saved traces: each of a corpus built here (wrong types, NaN and huge numbers, surrogates,
deep nesting, oversized strings, broken encodings and gzip, FIFOs, symlink loops, unlistable
folders ...) gives ``torchmagic.analyze`` and ``%torchprofile --load`` either a report that renders
or one line naming the file and what is wrong in it, with none of torchmagic's frames shown; and
memory stays bounded by what is kept, not by what the file repeats."""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
import tracemalloc

import pytest

import torchmagic
from torchmagic.features.profile.traces import reader as reader_module
from torchmagic.features.profile.traces import run as run_module
from torchmagic.features.profile.traces.reader import TraceFileError, TraceReader

from ...conftest import run

pytestmark = pytest.mark.trace_files  # the lanes of other torch releases skip it

if sys.platform != "linux":  # FIFOs, /dev/null
    pytestmark = [pytestmark, pytest.mark.skip("POSIX files")]

STEP = '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}'
KERNEL = ('{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10, "dur": 20, '
          '"args": {"correlation": 5, "External id": 3}}')
HUGE = "9" * 5000     # more digits than Python converts: invalid
LARGE = "9" * 40      # decodes, but out of any range a trace uses


def op(**fields) -> str:
    """An X event (a cpu op by default) as JSON text, each field given as raw JSON text."""
    base = {"ph": '"X"', "cat": '"cpu_op"', "name": '"aten::mm"', "pid": "1", "tid": "1", "ts": "10", "dur": "5",
            "args": '{"External id": 3, "Sequence number": 4, "Input Dims": [[2, 3], [3, 4]], '
                    '"Input type": ["float", "float"], "Concrete Inputs": ["", ""]}'}
    base.update(fields)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in base.items() if v is not None) + "}"


def with_args(**args) -> str:
    return op(args="{" + ", ".join(f'"{k}": {v}' for k, v in args.items()) + "}")


def trace(*events: str, **top: str) -> str:
    head = "".join(f'"{k}": {v}, ' for k, v in top.items())
    return "{" + head + f'"traceEvents": [{STEP}, ' + ", ".join(events) + "]}"


# (id, text of the file, what the one-line error says, or None: a report that renders)
CASES: list[tuple[str, str | bytes, str | None]] = []


def case(name: str, text, expect: str | None) -> None:
    CASES.append((name, text, expect))


BAD_NUMBERS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity", "string": '"12"', "list": "[1]",
               "object": '{"a": 1}', "null": "null", "bool": "true", "e999": "1e999", "large": LARGE}
for field in ("ts", "dur"):
    for label, value in BAD_NUMBERS.items():
        if not (field == "dur" and label == "null"):  # a null dur is a missing one: 0
            case(f"{field}-{label}", trace(op(**{field: value})), f"traceEvents[1] (\"aten::mm\"): '{field}' is")
    case(f"{field}-huge", trace(op(**{field: HUGE})), "holds a number too long to read")
    case(f"{field}-missing", trace(op(**{field: None})), None if field == "dur" else "'ts' is missing")
case("dur-negative", trace(op(dur="-3")), "'dur' is -3, not a number of 0 or more")
case("dur-null", trace(op(dur="null")), None)
for label, value in {"int": "123", "list": '["a"]', "object": "{}", "bool": "false", "huge": HUGE,
                     "large": LARGE}.items():
    case(f"name-{label}", trace(op(name=value)), "'name' is" if label != "huge" else "number too long")
for label, value in {"surrogate": r'"\ud800"', "low-surrogate": r'"aten::\udfff"', "pair-cut": r'"\ud83d x"',
                     "control": r'"\u0000\u001b[31m"', "empty": '""', "null": "null", "emoji": r'"\ud83d\ude00"',
                     "rtl": '"\u202eevil"', "long": '"' + "n" * 5000 + '"'}.items():
    case(f"name-{label}", trace(op(name=value)), None)
    case(f"step-name-{label}", trace(op(name=value, cat='"user_annotation"')), None)
for label, value in {"int": "1", "list": "[]", "object": "{}", "bool": "true"}.items():
    case(f"cat-{label}", trace(op(cat=value)), "'cat' is")
case("cat-surrogate", trace(op(cat=r'"\ud800_events"')), None)
case("cat-many", trace(*(op(cat=f'"c{i}"') for i in range(400))), None)
for label, value in {"list": "[1]", "object": '{"a": 1}', "fraction": "1.5", "bool": "true", "null": "null",
                     "large": LARGE}.items():
    case(f"tid-{label}", trace(op(tid=value)), "'tid' is")
    case(f"gloo-tid-{label}", trace(op(cat='"user_annotation"', name='"gloo:all_reduce"', tid=value)), "'tid' is")
case("tid-surrogate", trace(op(tid=r'"\ud800"')), None)
for label, value in {"int": "1", "list": "[1, 2]", "string": '"x"', "bool": "true"}.items():
    case(f"args-{label}", trace(op(args=value)), "'args' is")
    case(f"kernel-args-{label}", trace(KERNEL.replace('{"correlation": 5, "External id": 3}', value)), "'args' is")
    case(f"gloo-args-{label}", trace(op(cat='"user_annotation"', name='"gloo:all_reduce"', args=value)), "'args' is")
for key, values in {"Sequence number": ['"1"', "1.5", "[]", LARGE, "true"],
                    "flops": ['"1"', "-1", "NaN", "[]", "Infinity"],
                    "correlation": ['"x"', "[1]", LARGE],
                    "Input Dims": ["1", '"x"', "[1]", '[["a"]]', "[[-1]]", "[[" + ", ".join(["1"] * 70) + "]]",
                                   "[[[1, [2]]]]", "[[" + LARGE + "]]", f"[[{2**40}, {2**40}]]", "[[1.0]]"],
                    "Input type": ["1", "[1]", '"float"', "[null]", "[[]]"],
                    "Concrete Inputs": ["1", "[1]", "{}"]}.items():
    for number, value in enumerate(values):
        case(f"{key.replace(' ', '-')}-{number}", trace(with_args(**{key: value})), f'args["{key}"]')
for key in ("Input Dims", "Input type", "Concrete Inputs"):  # an op on 5,000 tensors: its shapes left out
    case(f"{key.replace(' ', '-')}-5000", trace(with_args(**{key: "[" + ", ".join(['[]' if key == "Input Dims"
                                                                                      else '""'] * 5000) + "]"})), None)
for number, value in enumerate(['["{[]: 1}", ""]', '["' + "1" * 5000 + '"]', '["' + "[" * 300 + '"]',
                                r'["\ud800"]', '["1e999", "-0"]']):
    case(f"Concrete-Inputs-odd-{number}", trace(with_args(**{"Input Dims": "[[2], []]", "Concrete Inputs": value})),
         None)
MEMORY = '{{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12, "args": {}}}'
for key, values in {"Bytes": ['"1"', "1.5", "[]", "NaN", LARGE], "Device Type": ["99", '"cpu"', "-1"],
                    "Device Id": ['"0"', "[0]"]}.items():
    for number, value in enumerate(values):
        case(f"memory-{key.replace(' ', '-')}-{number}", trace(op(), MEMORY.format(f'{{"{key}": {value}}}')),
             f'args["{key}"]')
case("memory-no-ts", trace(op(), MEMORY.format("{}").replace('"ts": 12, ', "")), "'ts' is missing")
for key, value in {"Collective name": "1", "In msg nelems": '"1"', "dtype": "[1]"}.items():
    comms = {"Collective name": '"allreduce"', "In msg nelems": "10", "dtype": '"Float"', key: value}
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in comms.items()) + "}"
    case(f"comms-{key.replace(' ', '-')}", trace(op(name='"record_param_comms"', args=text)), f'args["{key}"]')
case("comms-negative", trace(op(name='"record_param_comms"',
                                args='{"Collective name": "allreduce", "In msg nelems": -5}')), "In msg nelems")
for label, name in {"superscript": "ProfilerStep#\u00b2", "digits": "ProfilerStep#" + "9" * 5000,
                    "negative": "ProfilerStep#-1", "arabic": "ProfilerStep#\u0663"}.items():
    case(f"step-{label}", trace(op(name=json.dumps(name), cat='"user_annotation"')), None)
for label, value in {"string": '"0"', "negative": "-1", "large": LARGE, "list": "[0]"}.items():
    case(f"rank-{label}", trace(op(), distributedInfo=f'{{"rank": {value}, "world_size": 2}}'),
         'distributedInfo["rank"]')
case("world-size-zero", trace(op(), distributedInfo='{"rank": 0, "world_size": 0}'), 'distributedInfo["world_size"]')
case("backend-odd", trace(op(), distributedInfo=r'{"rank": 0, "world_size": 1, "backend": "\ud800"}'), None)
case("info-list", trace(op(), distributedInfo="[1, 2]"), None)
for label, value in {"int": "1", "list": "[1]", "strings": '[{"computeMajor": "8", "name": 5}]',
                     "surrogate": r'[{"computeMajor": 8, "computeMinor": 0, "name": "\ud800 GPU"}]',
                     "large": f'[{{"computeMajor": {LARGE}}}]'}.items():
    case(f"device-{label}", trace(op(), KERNEL, deviceProperties=value), None)
# structure and nesting
case("empty-file", "", "expected '{' or '['")
case("whitespace", " \n\t ", "expected '{' or '['")
for label, text in {"int": "5", "string": '"x"', "null": "null", "true": "true"}.items():
    case(f"top-{label}", text, "expected '{' or '['")
for label, text in {"int": "5", "object": "{}", "string": '"x"', "null": "null"}.items():
    case(f"events-{label}", f'{{"traceEvents": {text}}}', "to open traceEvents")
for label, text in {"ints": "[1, 2]", "null": "[null]", "lists": "[[]]", "strings": '["x"]'}.items():
    case(f"event-{label}", f'{{"traceEvents": {text}}}', "traceEvents[0] is")
case("no-events", '{"traceEvents": []}', "has no timed events")
case("bare-array", f"[{STEP}, {op()}]", None)
case("no-traceEvents", '{"a": 1}', "has no traceEvents")
case("int-key", '{1: 2}', "top level is not a JSON object")
case("trailing-comma", f'{{"traceEvents": [{STEP},]}}', "invalid JSON")
case("missing-colon", '{"traceEvents" [1]}', "expected ':'")
case("bom", "\ufeff" + trace(op()), "expected '{' or '['")
case("unterminated-string", '{"traceEvents": [{"name": "abc', "truncated")
case("lone-backslash", '{"traceEvents": [{"name": "abc\\', "truncated")
case("duplicate-keys", trace(op()).replace('"traceEvents"', '"traceEvents": [], "traceEvents"', 1), None)
case("two-event-arrays", trace(op()).rstrip("}") + f', "traceEvents": [{op()}]}}', None)
for number, cut in enumerate((0.1, 0.5, 0.9, 0.999)):
    text = trace(op(), op(ts="20"), KERNEL)
    case(f"truncated-{number}", text[: int(len(text) * cut)], "truncated")
for where, depth in (("event", 100_000), ("args", 100_000), ("meta", 100_000), ("event", 150), ("meta", 150)):
    nest = "[" * depth + "]" * depth
    text = {"event": f'{{"traceEvents": [{STEP}, {nest}]}}',
            "args": trace(with_args(deep=nest)),
            "meta": trace(op(), stackFrames=nest)}[where]
    case(f"nested-{where}-{depth}", text, "nested" if depth > 1000 or where == "meta" else "traceEvents[1] is")
case("nested-args-40", trace(with_args(deep="[" * 40 + "]" * 40)), None)
case("huge-meta-number", trace(op(), baseTimeNanoseconds=HUGE), "number too long")
case("large-meta-number", trace(op(), baseTimeNanoseconds=LARGE), None)
case("long-key", '{"' + "k" * 100_000 + '": 1, ' + trace(op())[1:], None)
case("long-meta", trace(op(), systemTraceEvents='"' + "s" * 1_200_000 + '"'), None)
case("many-meta-keys", "{" + "".join(f'"k{i}": {i}, ' for i in range(1000)) + trace(op())[1:], None)
case("escapes-meta", trace(op(), note='"' + "\\\\\\\"" * 200_000 + '"'), None)
case("long-name-event", trace(op(name='"' + "x" * 3_000_000 + '"')), None)
case("oversized-event", trace(op(name='"' + "x" * 9_000_000 + '"')), None)
case("nan-literal-event", f'{{"traceEvents": [{STEP}, NaN]}}', "traceEvents[1] is")
case("latin1", trace(op(name='"caf\xe9"')).encode("latin-1"), "cannot be read")
case("utf16", trace(op()).encode("utf-16"), "cannot be read")
case("overlong-utf8", trace(op()).encode().replace(b'"aten::mm"', b'"\xc0\xaf"'), "cannot be read")
case("nul-bytes", trace(op()).replace('"ts"', '"\x00ts"'), "invalid JSON")
case("gz-truncated", gzip.compress(trace(op(), op(ts="20")).encode())[:-12], "cannot be read")
case("gz-corrupt", gzip.compress(trace(op()).encode())[:20] + b"\x00" * 40, "cannot be read")
case("gz-header-only", b"\x1f\x8b", "cannot be read")
case("gz-garbage-after", gzip.compress(trace(op()).encode()) + b"garbage!", "cannot be read")
case("gz-not-json", gzip.compress(b"\x00\x01\x02 not json"), "expected '{' or '['")
case("gz-whitespace-bomb", gzip.compress(b" " * 20_000_000 + trace(op()).encode(), 9), None)
case("gz-ok", gzip.compress(trace(op()).encode()), None)


def _write(path, text) -> str:
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    return str(path)


def _files(tmp_path, name):
    """The cases that are paths rather than contents: (source, what the error says or None)."""
    good = trace(op())
    if name == "fifo":
        os.mkfifo(tmp_path / "f.json")
        return str(tmp_path / "f.json"), "is a FIFO"
    if name == "fifo-in-dir":
        os.mkfifo(tmp_path / "rank0.json")
        return str(tmp_path), "holds no trace files"  # not a regular file: not listed
    if name == "symlink-loop":
        os.symlink(tmp_path / "b.json", tmp_path / "a.json")
        os.symlink(tmp_path / "a.json", tmp_path / "b.json")
        return str(tmp_path / "a.json"), "symbolic links"
    if name == "symlink-loop-in-dir":
        os.symlink(tmp_path / "b.json", tmp_path / "a.json")
        os.symlink(tmp_path / "a.json", tmp_path / "b.json")
        return str(tmp_path), "holds no trace files"
    if name == "dangling-symlink":
        os.symlink(tmp_path / "gone.json", tmp_path / "a.json")
        return str(tmp_path / "a.json"), "does not exist"
    if name == "dev-null":
        return "/dev/null", "not a regular file"
    if name == "dir-named-json":
        os.mkdir(tmp_path / "d.json")
        return str(tmp_path / "d.json"), "holds no trace files"
    if name == "empty-dir":
        return str(tmp_path), "holds no trace files"
    if name == "nul-in-path":
        return str(tmp_path / "a\x00.json"), "cannot be read"
    if name == "surrogate-path":
        return str(tmp_path) + "/\ud800.json", "cannot be read"
    if name == "non-utf8-name":
        path = os.path.join(os.fsencode(tmp_path), b"rank0-\xff.json")
        _write(path, good)
        return os.fsdecode(path), None
    if name == "non-utf8-name-bad":
        path = os.path.join(os.fsencode(tmp_path), b"bad-\xff.json")
        _write(path, "{")
        return os.fsdecode(path), "bad-\ufffd.json: "
    if name == "empty-list":
        return [], "was given no trace files"
    if name == "list-of-ints":
        return [1, 2], "takes a list of paths"
    if name == "an-int":
        return 5, "not int"
    if name == "too-many-ranks":
        for i in range(run_module.MAX_RANKS + 1):
            _write(tmp_path / f"rank{i}.json", "{")  # never read: refused on the count
        return str(tmp_path), "analyze compares at most 1,024 ranks"
    if name == "too-many-in-list":
        return (str(tmp_path / f"rank{i}.json") for i in range(10**9)), "analyze compares at most 1,024 ranks"
    if name == "rank-mix":
        _write(tmp_path / "rank0.json", trace(op(), distributedInfo='{"rank": 0, "world_size": 2}'))
        _write(tmp_path / "rank1.json", trace(op(name=r'"\ud800"'), distributedInfo='{"rank": 1, "world_size": 2}'))
        return str(tmp_path), None
    raise AssertionError(name)


FILE_CASES = ["fifo", "fifo-in-dir", "symlink-loop", "symlink-loop-in-dir", "dangling-symlink", "dev-null",
              "dir-named-json", "empty-dir", "nul-in-path", "surrogate-path", "non-utf8-name", "non-utf8-name-bad",
              "empty-list", "list-of-ints", "an-int", "too-many-ranks", "too-many-in-list", "rank-mix", "unlistable"]


def test_the_corpus_is_big_enough():
    assert len(CASES) + len(FILE_CASES) >= 130


def _analyze_api(source, expect):
    """analyze(source): a report that renders as UTF-8, or one line holding ``expect`` whose
    traceback shows no torchmagic frame (IPython hides those marked ``__tracebackhide__``)."""
    try:
        result = torchmagic.analyze(source)
    except TraceFileError as exc:
        message = str(exc)
        assert expect is not None, f"refused: {message}"
        assert expect in message and "\n" not in message and len(message) < 600, message
        message.encode("utf-8")
        tb = exc.__traceback__.tb_next  # past this frame
        shown = []
        while tb is not None:
            if "torchmagic" in tb.tb_frame.f_code.co_filename and not tb.tb_frame.f_locals.get("__tracebackhide__"):
                shown.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        assert shown == [], shown
        return message
    assert expect is None, f"expected a refusal saying {expect!r}"
    result.to_text().encode("utf-8")
    result.to_html().encode("utf-8")
    return result


def _load_magic(shell, source, expect):
    """The same through %torchprofile --load in a real shell: a report, or one UsageError line."""
    result, captured = run(shell, f"%torchprofile --load {source}")
    shown = (captured.stdout + captured.stderr).strip()
    if expect is None:
        assert result.success, shown[-2000:]
        shown.encode("utf-8")
    else:
        assert not result.success and "Traceback" not in shown and "torchmagic/" not in shown, shown[-2000:]
        assert shown.startswith("UsageError: %torchprofile --load: ") and "\n" not in shown, shown[-2000:]
        assert expect in shown or len(shown) >= 299, shown  # usage errors are kept to 300 characters


@pytest.mark.parametrize("name,text,expect", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_trace_gives_a_report_or_one_line(name, text, expect, tmp_path, shell):
    path = _write(tmp_path / ("t.json.gz" if name.startswith("gz-") else "t.json"), text)
    _analyze_api(path, expect)
    _load_magic(shell, path, expect)


@pytest.mark.parametrize("name", FILE_CASES)
def test_hostile_paths_give_a_report_or_one_line(name, tmp_path, shell, monkeypatch):
    if name == "unlistable":
        _write(tmp_path / "rank0.json", trace(op()))
        if os.geteuid() == 0:  # root lists any folder: make listing fail as it does for others
            def refuse(path):
                raise PermissionError(13, "Permission denied", path)
            monkeypatch.setattr(run_module.os, "scandir", refuse)
        else:
            os.chmod(tmp_path, 0o300)
        try:
            _analyze_api(str(tmp_path), "cannot be listed (Permission denied)")
            _load_magic(shell, str(tmp_path), "cannot be listed (Permission denied)")
        finally:
            os.chmod(tmp_path, 0o700)
        return
    source, expect = _files(tmp_path, name)
    started = time.perf_counter()
    _analyze_api(source, expect)
    assert time.perf_counter() - started < 20  # a FIFO, a loop or 1,025 files: nothing waits or reads them all
    if isinstance(source, str) and "\x00" not in source and source.isascii():
        _load_magic(shell, source, expect)


def test_strings_are_cut_and_surrogates_replaced_in_the_report(tmp_path):
    path = _write(tmp_path / "t.json", trace(op(name='"' + "n" * 5000 + '"'), op(name=r'"bad\ud800name"', ts="20")))
    r = torchmagic.analyze(path)
    names = {o.name for o in r.profile.ops}
    assert "bad\ufffdname" in names and any(n.startswith("n" * 1024 + "…[cut: 5,000 characters]") for n in names)
    assert any("1 string(s) longer than 1,024 characters" in note for note in r.notes)


def test_an_oversized_event_and_meta_value_are_left_out_and_said(tmp_path):
    path = _write(tmp_path / "t.json", trace(op(), op(name='"' + "x" * 9_000_000 + '"'),
                                             systemTraceEvents='"' + "s" * 1_200_000 + '"'))
    r = torchmagic.analyze(path)
    assert any("1 event(s) longer than 8,388,608 characters were left out" in note for note in r.notes)
    assert any("top-level value(s) too long to keep were left out: \"systemTraceEvents\"" in n for n in r.notes)


def test_a_long_value_is_decoded_once_not_after_every_chunk(tmp_path, monkeypatch):
    """A value longer than a chunk is scanned to its end first, then decoded once (it was decoded
    again after every chunk read: quadratic)."""
    monkeypatch.setattr(reader_module, "CHUNK_CHARS", 1024)
    path = _write(tmp_path / "t.json", trace(op(name='"' + "x" * 2_000_000 + '"')))
    reader = TraceReader(path)
    calls = []
    decode = reader._decoder.raw_decode
    reader._decoder.raw_decode = lambda *a: calls.append(1) or decode(*a)
    assert len(list(reader)) == 2
    assert len(calls) < 20, len(calls)


def _traced(fn) -> tuple[object, float, float]:
    """fn()'s result, the memory (MiB) allocated at its peak, and that still held with its result."""
    tracemalloc.start()
    try:
        result = fn()
        held, peak = tracemalloc.get_traced_memory()
        return result, held / 2**20, peak / 2**20
    finally:
        tracemalloc.stop()


def test_a_gzip_bomb_of_repeated_collectives_keeps_one(tmp_path):
    """60k identical gloo:all_reduce events in a 60 KB .gz: memory is what is kept, not what repeats
    (each was kept, twice over: 19 MiB at the peak before; the 2M-event bomb is in
    benchmarks/hostile_traces.py)."""
    torchmagic.analyze(_write(tmp_path / "warm.json", trace(op())), operators=False)  # imports, outside the count
    event = op(cat='"user_annotation"', name='"gloo:all_reduce"', tid="9", ts="20", dur="50", args="{}")
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(f'{{"traceEvents": [{STEP}, {(event + ", ") * 60_000}{op()}]}}'.encode(), 6))
    assert path.stat().st_size < 100_000
    r, _, peak = _traced(lambda: torchmagic.analyze(path, operators=False))
    assert r.events == 60_002 and r.ranks[0].collectives["all_reduce"]["calls"] == 1
    assert peak < 10, f"{peak:.1f} MiB traced"  # a chunk of text and its decode: the same at 2M events


def test_a_long_name_is_not_kept_whole(tmp_path):
    torchmagic.analyze(_write(tmp_path / "warm.json", trace(op())))
    path = _write(tmp_path / "t.json", trace(op(name='"' + "x" * 4_000_000 + '"', args=None)))
    r, held, peak = _traced(lambda: torchmagic.analyze(path))
    assert r.profile is not None and any(o.name.startswith("x" * 1024 + "…[cut") for o in r.profile.ops)
    assert held < 1 and peak < 20, (held, peak)  # the name was kept: 3.8 MiB held



def test_one_step_of_more_events_than_a_group_holds_gets_its_operator_table(tmp_path, monkeypatch):
    """Groups of steps bound what the summary makes at once, not what it tables: one step holding more events than
    a group is tabled whole, its slices typed or read event by event (a name the typed decoder refuses)."""
    from torchmagic.features.profile.traces import ops

    monkeypatch.setattr(ops, "GROUP_EVENTS", 50)
    ops_only = [op(ts=str(10 + i)) for i in range(200)]
    r = torchmagic.analyze(_write(tmp_path / "host.json", trace(*ops_only)))
    assert r.profile is not None and {o.name: o.calls for o in r.profile.ops} == {"aten::mm": 200}, r.notes
    r = torchmagic.analyze(_write(tmp_path / "gpu.json", trace(*ops_only, KERNEL)))
    assert r.profile is not None and r.profile.device.kind == "cuda", r.notes
    refused = op(name=r'"aten::\udfff"')
    r = torchmagic.analyze(_write(tmp_path / "refused.json", trace(*ops_only, refused)))
    assert {o.name: o.calls for o in r.profile.ops} == {"aten::mm": 200, "aten::\ufffd": 1}, r.notes
