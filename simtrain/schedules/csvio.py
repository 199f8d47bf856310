"""Schedule interchange with PyTorch / torchtitan's pipeline runtime CSV format.

Format (torch.distributed.pipelining `_PipelineScheduleRuntime._load_csv` / `_dump_csv`, as
torchtitan's `pipeline_parallel_schedule_csv` reads it): one row per pipeline rank, no header,
comma-separated actions in execution order, an empty cell for an idle slot. An action is
`<stage><type><microbatch>`, where stage is the global model-stage index (not the rank) and type
is F (forward), I (input-gradient backward, simtrain's B), W (weight gradient) or B (full
backward, simtrain's BW); e.g. `0F3`, `5I1`, `5W1`, `2B0`. An overlapped forward/backward pair
is written `(0F2;7B1)OVERLAP_F_B`. Communication and sharding actions (SEND_F, RECV_F, SEND_B,
RECV_B, UNSHARD, RESHARD, REDUCE_GRAD) are accepted on import and skipped: simtrain derives its
own communication from the compute order.

Worked example: 1F1B on 2 ranks with 2 microbatches exports as
    0F0,0F1,0B0,0B1
    1F0,1B0,1F1,1B1
"""
from __future__ import annotations

import re
from pathlib import Path

from simtrain.errors import ConfigError, Problem, ScheduleError
from simtrain.schedules.registry import Action, Schedule
from simtrain.schedules.validate import validate
from simtrain.spec.files import TreeError, read_text, short

TO_CSV = {"F": "F", "B": "I", "W": "W", "BW": "B"}
FROM_CSV = {v: k for k, v in TO_CSV.items()}
_ACTION = re.compile(r"^(\d+)(F|I|W|B)(\d+)$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
MAX_ROWS = 16_384         # pipeline ranks read when the plan's pp is not known
MAX_DIGITS = 9            # digits of a stage or microbatch index
MAX_PROBLEMS = 20
_COMM = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)(\d*)$")


def to_csv(s: Schedule) -> str:
    held = [st for row in s.stage_of for st in row]
    if len(held) != len(set(held)):
        raise ScheduleError(f"schedule {s.name} holds some model stages on two ranks (parameters twice); the CSV "
                            f"format names a stage by its index, so it cannot express that; export dualpipev instead")
    lines = []
    for r, acts in enumerate(s.actions):
        cells = []
        i = 0
        while i < len(acts):
            a = acts[i]
            cell = f"{s.stage_of[r][a.chunk]}{TO_CSV[a.kind]}{a.microbatch}"
            if a.overlap_next:
                b = acts[i + 1]
                cell = f"({cell};{s.stage_of[r][b.chunk]}{TO_CSV[b.kind]}{b.microbatch})OVERLAP_F_B"
                i += 1
            cells.append(cell)
            i += 1
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n"


def _whole(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None


def read_csv(path: str | Path, key: str = "parallel.schedule_csv", pp: object = None, microbatches: object = None) -> Schedule:
    """Parses a CSV schedule; every problem becomes one ConfigError naming file, row and cell.

    Parsing is bounded: the file goes through the guarded reader (a regular file of at most
    MAX_FILE_BYTES), at most `pp` rows are read (MAX_ROWS when the plan's pp is not known), and a
    stage or microbatch index is refused past what the plan needs: a microbatch index from the
    plan's `microbatches` on when known; else, and for stages always, from the number of compute
    actions in the file on (a schedule runs every stage on every microbatch, so no index of a
    valid one reaches that count)."""
    path = Path(path)
    try:
        text = read_text(path)
    except TreeError as e:
        raise ConfigError([Problem(str(path), key, f"the schedule file {e}", "give a CSV schedule file (torchtitan's action format)")])
    pp, microbatches = _whole(pp), _whole(microbatches)
    max_rows = pp or MAX_ROWS
    problems = []
    rows = []
    lines = []          # file line of each row (blank lines are not ranks)
    where = []          # (file line, cell) of each parsed cell, per row
    for ln, line in enumerate(text.splitlines(), 1):
        if len(problems) >= MAX_PROBLEMS:
            break
        if not line.strip():
            continue
        if len(rows) >= max_rows:
            more = sum(1 for x in text.splitlines()[ln - 1:] if x.strip())
            problems.append(Problem(str(path), f"row {ln}", f"{more:,} rows beyond the first {max_rows:,}: the plan has "
                                    + (f"pp={pp} pipeline ranks" if pp else f"at most {MAX_ROWS:,} rows are read"),
                                    "write one row of actions per pipeline rank"))
            break
        lines.append(ln)
        row, pos = [], []
        for col, cell in enumerate(line.split(","), 1):
            cell = cell.strip()
            if not cell or _COMM.match(cell):
                continue
            m = _OVERLAP.match(cell)
            parts = m.group(1).split(";") if m else [cell]
            parsed = []
            for part in parts:
                pm = _ACTION.match(part.strip())
                if not pm:
                    problems.append(Problem(str(path), f"row {ln}, cell {col}", f"{short(part.strip(), 40)} is not an action",
                                            "write <stage><F|I|W|B><microbatch>, e.g. 0F3, or (0F2;7B1)OVERLAP_F_B"))
                    break
                if len(pm.group(1)) > MAX_DIGITS or len(pm.group(3)) > MAX_DIGITS:
                    what = "stage" if len(pm.group(1)) > MAX_DIGITS else "microbatch"
                    problems.append(Problem(str(path), f"row {ln}, cell {col}", f"{what} index of {short(part.strip(), 40)} has "
                                            f"more than {MAX_DIGITS} digits", f"number {what}s from 0 to what the plan has"))
                    break
                parsed.append((int(pm.group(1)), FROM_CSV[pm.group(2)], int(pm.group(3))))
            else:
                if m and len(parsed) != 2:
                    problems.append(Problem(str(path), f"row {ln}, cell {col}", f"an OVERLAP_F_B cell holds {len(parsed)} actions",
                                            "pair exactly two, e.g. (0F2;7B1)OVERLAP_F_B"))
                    continue
                row.append(parsed)
                pos.append((ln, col))
        rows.append(row)
        where.append(pos)
    if not rows and not problems:
        problems.append(Problem(str(path), "", "the schedule file has no rows", "write one row of actions per pipeline rank"))
    # indexes beyond what the plan needs (the schedule would hold that many stages / microbatches)
    n_actions = sum(len(cell) for row in rows for cell in row)
    max_mb, max_st = microbatches or n_actions, n_actions
    for row, pos in zip(rows, where):
        for cell, (ln, col) in zip(row, pos):
            for st, _, mb in cell:
                if len(problems) >= MAX_PROBLEMS:
                    break
                if st >= max_st:
                    problems.append(Problem(str(path), f"row {ln}, cell {col}", f"stage {st:,} is beyond the "
                                            f"{max_st:,} actions of the file (each stage runs every microbatch)",
                                            f"number the stages 0..{max_st - 1}"))
                elif mb >= max_mb:
                    problems.append(Problem(str(path), f"row {ln}, cell {col}", f"microbatch {mb:,} is beyond the "
                                            + (f"plan's {max_mb} microbatches" if microbatches else f"{max_mb:,} actions of the file"),
                                            f"number the microbatches 0..{max_mb - 1}"
                                            + (" (global_batch_size / (micro_batch_size x dp))" if microbatches else "")))
    if problems:
        raise ConfigError(problems[:MAX_PROBLEMS])
    rank_of: dict = {}
    for r, row in enumerate(rows):
        for cell in row:
            for st, _, _ in cell:
                if rank_of.setdefault(st, r) != r:
                    raise ConfigError([Problem(str(path), f"row {lines[r]}", f"stage {st} also appears on row {lines[rank_of[st]]}",
                                               "each model stage lives on one rank")])
    if not rank_of:
        raise ConfigError([Problem(str(path), "", "the schedule has no compute actions (F, I, W or B)",
                                   "list each rank's compute actions; communication actions alone say nothing")])
    S = max(rank_of) + 1
    missing = [k for k in range(S) if k not in rank_of]
    if missing:
        raise ConfigError([Problem(str(path), "", f"stages {missing} never appear", f"number the stages 0..{S - 1} without gaps")])
    stage_of = tuple(tuple(sorted(k for k, r in rank_of.items() if r == rank)) for rank in range(len(rows)))
    empty = [lines[r] for r, held in enumerate(stage_of) if not held]
    if empty:
        raise ConfigError([Problem(str(path), f"rows {empty}", "hold no stage", "give every pipeline rank at least one stage")])
    chunk_of = {k: (r, row.index(k)) for r, row in enumerate(stage_of) for k in row}
    route = tuple(chunk_of[k] for k in range(S))
    actions = []
    for r, row in enumerate(rows):
        acts = []
        for cell in row:
            for j, (st, kind, mb) in enumerate(cell):
                acts.append(Action(kind, mb, chunk_of[st][1], overlap_next=(len(cell) == 2 and j == 0)))
        actions.append(tuple(acts))
    m = 1 + max((a.microbatch for acts in actions for a in acts), default=-1)
    s = Schedule(name=f"csv:{path.stem}", pp=len(rows), microbatches=m, actions=tuple(actions),
                 stage_of=stage_of, routes=(route,), route_of=(0,) * m)
    try:
        validate(s)
    except ScheduleError as e:
        raise ConfigError([Problem(str(path), "rows", str(e).replace(f"schedule {s.name}: ", "").replace(f"schedule {s.name} ", "schedule "),
                                   "fix the schedule rows (row n is pipeline rank n-1)")])
    return s
