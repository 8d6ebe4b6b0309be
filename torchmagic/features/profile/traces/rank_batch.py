"""The per-rank pass over a batch the columns already read (columns.BatchColumns): what rank._Reading.records
does record by record, done over tensors for the records that only add to unions, counts and id lists (host ops,
backward nodes, device work, runtime calls, those only counted); the rest (steps, data loading, collectives and
their sizes, c10d calls) still go one by one, and a batch with a record the typed path would read from its dict
is left to the loop whole."""

from __future__ import annotations

from array import array

import torch

from ..array_views import doubles

# a record's role as rank._Reading.records dispatches it, as codes (NOT_TIMED: a memory record, no 'X'; UNREAD:
# its name or category is not plain, so that records reads it from its dict)
HOST, BACKWARD, DEVICE, LAUNCH, COUNTED, TAKEN, NOT_TIMED, UNREAD = range(8)


class BatchRoles:
    """Each column kind code's role and category (a code into ``categories``), as the per-rank pass reads the
    (name, cat) it stands for; grown as the columns make codes."""

    def __init__(self, role_codes: dict[str, int]):
        self.role_codes = role_codes  # rank's roles as the codes above
        self.roles: list[int] = []
        self.category_codes: list[int] = []
        self.categories: list[str] = []
        self._codes: dict[str, int] = {}
        self._tensors: tuple[torch.Tensor, torch.Tensor] | None = None

    def tensors(self, raw_kinds: list[tuple], kind_of) -> tuple[torch.Tensor, torch.Tensor]:
        """(role, category code) by kind code, for every code made so far (``kind_of``: rank's (name, cat,
        detailed, role) of a raw pair, None where one is not plain: UNREAD then)."""
        made = len(self.roles)
        if self._tensors is not None and made == len(raw_kinds):
            return self._tensors
        for raw in raw_kinds[made:]:
            kind = kind_of(*raw)
            _, cat, _, role = kind or (None, "", False, None)
            self.roles.append(UNREAD if kind is None else self.role_codes[role])
            if cat not in self._codes:
                self._codes[cat] = len(self.categories)
                self.categories.append(cat)
            self.category_codes.append(self._codes[cat])
        roles, categories = torch.tensor(self.roles[made:], dtype=torch.int8), torch.tensor(self.category_codes[made:])
        if self._tensors is not None:  # (a step's marker is a new name each step: a few new codes a batch)
            roles, categories = torch.cat([self._tensors[0], roles]), torch.cat([self._tensors[1], categories])
        self._tensors = (roles, categories)
        return self._tensors


def category_counts(codes: torch.Tensor, counted: torch.Tensor, names: list[str], known: dict) -> list[tuple[str, int]]:
    """(category, how many of ``counted`` rows have it) for each category among ``codes`` (codes into ``names``), in
    the order they first appear, as a loop over the rows would add them to a dict (``known``: the categories it
    holds already, whose order no count changes)."""
    if not len(codes):
        return []
    present = torch.bincount(codes, minlength=len(names)).nonzero().flatten().tolist()
    if all(names[code] in known for code in present):
        counts = torch.bincount(codes[counted], minlength=len(names)).tolist()
        return [(names[code], counts[code]) for code in present]
    unique, inverse = torch.unique(codes, return_inverse=True)
    first = torch.full((len(unique),), len(codes)).scatter_reduce_(0, inverse, torch.arange(len(codes)), "amin")
    counts = torch.bincount(inverse[counted], minlength=len(unique))
    order = torch.argsort(first)
    return [(names[code], count) for code, count in zip(unique[order].tolist(), counts[order].tolist())]


def add_links(starts: array, ends: array | None, ids: array, rows: tuple) -> None:
    """Runs (start, end where kept) with the correlation id linking them, appended in order, each kept once: one
    written again right after (the same id and start, as rank._correlated and _launched skip it) is not.
    ``rows``: their starts, ends and ids (tensors)."""
    start, end, corr = rows
    if not len(start):
        return
    keep = torch.ones(len(start), dtype=torch.bool)
    keep[1:] = (corr[1:] != corr[:-1]) | (start[1:] != start[:-1])
    if ids and ids[-1] == int(corr[0]) and starts[-1] == float(start[0]):
        keep[0] = False
    starts.extend(doubles(start[keep]))
    if ends is not None:
        ends.extend(doubles(end[keep]))
    ids.extend(array("q", corr[keep].tolist()))
