"""The codes a trace's columns (event_table.py) hold for what repeats: each (name, category), thread, op's inputs,
memory record's device and collective's description once, as the checked path keeps it (fields.py), however
it was written."""

from __future__ import annotations

from dataclasses import dataclass

from torch._C._autograd import DeviceType

from ....core.measure.low_precision import freeze
from ..event_kinds import DEVICE, MEMORY, event_kind
from ..kineto import CPU_OP, DEVICE_ACTIVITIES, STEP_PREFIX, USER_ANNOTATION, activity, is_runtime
from .fields import DEVICE_TYPES, INT_LIMIT
from .records import PlainFields


@dataclass
class EventKind:
    """What a (name, category) pair as written is read as."""

    name: str
    cat: str
    kind: int | None  # event_kinds.event_kind's


class TableCodes:
    """The codes of one trace's columns (``columns``: a EventTable, whose lists they index), made as values are
    first read: a slice's values as written (None where the checked path reads them instead), an event's read
    from its dict as kept."""

    def __init__(self, columns, plain: PlainFields):
        self.columns, self.plain = columns, plain
        self.memory_kinds: set[int] = set()  # the kind codes of memory records
        self.linked_kinds: set[int] = set()  # ... of runtime calls and device events
        self.comm_kinds: set[int] = set()    # ... of record_param_comms
        self.cut_kinds: dict[int, int] = {}  # kind code -> strings cut in its pair as written (counted each time)
        self._kinds: dict[tuple, int | None] = {}  # (name, cat) as written -> code (None: read checked)
        self._kept_kinds: dict[tuple, int] = {}    # (name, cat) as kept -> code
        self._threads: dict = {}                   # tid as written -> code
        self._kept_threads: dict = {}              # tid as kept -> code
        self._inputs: dict[tuple, int] = {}        # an op's inputs' texts -> code
        self._kept_inputs: dict[tuple, int] = {}   # an op's inputs as kept (lists as tuples) -> code
        self._devices: dict[tuple, int] = {}       # a memory record's (device type, index) -> code
        self._comms: dict[tuple, int] = {}         # a collective's (name, dtype) as kept -> code
        self.kept_input_code(([], [], []))  # code 0: none recorded

    def kinds(self, pairs: list[tuple]) -> list[int] | None:
        """The kind code of each (name, cat) as written in a slice."""
        return _codes(self._kinds, pairs, self._new_kind)

    def threads(self, tids: list) -> list[int] | None:
        """The code of each tid as written in a slice."""
        return _codes(self._threads, tids, self._new_thread)

    def devices(self, devices: list[tuple[int, int]]) -> list[int] | None:
        """The code of each memory record's (device type, index)."""
        return _codes(self._devices, devices, self._new_device)

    def input_code(self, args) -> int | None:
        """The code of an op's inputs as the checked path keeps them, or None where it would not keep them as
        written."""
        texts = bytes(args.dims), bytes(args.dtypes), bytes(args.concrete)
        code = self._inputs.get(texts)
        if code is None:
            kept = self.plain.op_inputs(args)
            if kept is None:
                return None
            code = self._inputs[texts] = self.kept_input_code(kept)
        return code

    def kept_input_code(self, kept: tuple[list, list, list]) -> int:
        """The code of inputs as kept: one per distinct value, however it was written."""
        key = freeze(kept)
        code = self._kept_inputs.get(key)
        if code is None:
            code = self._kept_inputs[key] = len(self.columns.input_lists)
            self.columns.input_lists.append(kept)
        return code

    def comm_code(self, name: str, dtype: str) -> int:
        """The code of a collective's (name, dtype) as record_param_comms says them."""
        code = self._comms.get((name, dtype))
        if code is None:
            code = self._comms[name, dtype] = len(self.columns.comm_kinds)
            self.columns.comm_kinds.append((name, dtype))
        return code

    def kind_code(self, name: str, text: str) -> int:
        """The code of a (name, category) as kept, one per distinct pair."""
        code = self._kept_kinds.get((name, text))
        if code is not None:
            return code
        cat = activity(text, name)
        kind = event_kind(cat, name)
        cols = self.columns
        cols.steps = cols.steps or (cat == USER_ANNOTATION and name.startswith(STEP_PREFIX))
        cols.kernels = cols.kernels or kind == DEVICE
        code = self._kept_kinds[name, text] = len(cols.kinds)
        cols.kinds.append(EventKind(name, cat, kind))
        if cat == CPU_OP and name == "record_param_comms":
            self.comm_kinds.add(code)
        if kind == MEMORY:
            self.memory_kinds.add(code)
        if cat in DEVICE_ACTIVITIES or is_runtime(cat):  # linked by CUPTI's correlation id (a name set aside too)
            self.linked_kinds.add(code)
        return code

    def thread_code(self, kept) -> int:
        code = self._kept_threads.get(kept)
        if code is None:
            code = self._kept_threads[kept] = len(self.columns.threads)
            self.columns.threads.append(kept)
        return code

    def _new_kind(self, pair: tuple) -> int | None:
        """The code of a slice's (name, cat), or None where the checked path reads more of such an event (a
        range, call or kernel named [memory]: its size and device)."""
        # as the checked path keeps them: a long name (a templated kernel's) cut, one not ASCII made printable
        check = self.plain.check
        cut = check.cut
        name, text = (check.text(value, {}, 0, "'name'") for value in pair)
        code = self.kind_code(name, text)
        if check.cut > cut:  # counted for each event of the pair, as the checked path counts each
            self.cut_kinds[code], check.cut = check.cut - cut, cut
        kept = self.columns.kinds[code]
        return None if name == "[memory]" and kept.kind != MEMORY and kept.cat != CPU_OP else code

    def _new_thread(self, tid) -> int | None:
        """The code of a slice's tid, or None where the checked path reads it (an integer past 64 bits)."""
        kept = self.plain.check.text(tid, {}, 0, "'tid'") if type(tid) is str else self.plain.tid(tid)
        return None if kept is None else self.thread_code(kept)

    def _new_device(self, device: tuple[int, int]) -> int | None:
        kind, index = device
        if kind not in DEVICE_TYPES or not -INT_LIMIT <= index < INT_LIMIT:
            return None
        self.columns.devices.append(device_label(DeviceType(kind), index))
        return len(self.columns.devices) - 1


def device_label(device_type: DeviceType, index: int) -> str:
    """A memory record's device, per device and never summed across GPUs: "cuda:1", as a Device's label reads."""
    return "cpu" if device_type == DeviceType.CPU else f"{str(device_type).rsplit('.', 1)[-1].lower()}:{max(index, 0)}"


def _codes(codes: dict, keys: list, new) -> list[int] | None:
    """Each key's code, new ones made by ``new`` (None where a key is not covered)."""
    try:
        found = [codes[key] for key in keys]
    except KeyError:
        for key in keys:
            if key not in codes:
                codes[key] = new(key)
        found = [codes[key] for key in keys]
    return None if None in found else found
