"""Each tuning number is named once, next to the rule that reads it, with the reason for its value
(issue 50). Read with ast, no import: a rule module of core/ or adapter/ compares with no bare
number and takes no bare number as a default (a function's parameter, a dataclass field); each
registered name is assigned once in the package, with a comment on its line or just above it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "radixflow_sglang"
RULE_DIRS = ("core", "adapter")
UPSTREAM = {"adapter/scan.py"}  # NOTE: SGLang's scan, copied: its numbers are upstream's
PLAIN = {0, 1, -1, 2}  # NOTE: 0.0 and 1.0 compare equal: not thresholds
# NOTE: the tuning numbers the rules read, each in the module beside its rule
TUNING = {
    "core/admission.py": ("FOLLOWERS_WINDOW", "TIMING_PRIOR", "HOLD_MS", "ARRIVAL_WINDOW_S",
                          "ARRIVAL_FLOOR_S"),
    "core/traversal.py": ("THETA_FLOOR", "PARK_MARGIN"),
    "core/points.py": ("FRAG_CAP",),
    "core/producers.py": ("CHAIN_KEEP", "COMPARE_STEP", "CHAIN_BLOCK", "VERIFY"),
    "core/cost.py": ("ALPHA_S", "PRIOR_ROUNDS", "FORGET", "REJECT_SIGMAS", "HUBER_SIGMAS",
                     "FIT_WINDOW", "SETTLE", "TRUST", "SIGMA_FLOOR", "SIGMA_FLOOR_S",
                     "COLD_SIGMA", "PAPER_TOKENS", "PAPER_ROWS", "CUT_MARGIN"),
    "core/boundary.py": ("USAGE_WINDOW", "LEARN_WINDOW", "LEARN_SUPPORT", "REPEAT_SUPPORT",
                         "NAMESPACES", "PUBLICATION_KEYS", "MARKER_SPAN", "MARKER_MIN_LEN",
                         "MARKER_SUPPORT", "MARKER_LIMIT", "PIECE_WINDOW", "PIECE_KEEP",
                         "PIECE_SUPPORT"),
    "adapter/admission.py": ("FOLLOW_SPAN",),
    "adapter/scanview.py": ("SIBLING_WINDOW",),
    "adapter/slot.py": ("GROUPS",),
    "adapter/slotdefer.py": ("MAX_DEFER", "STALE", "DEFER_HEAD"),
    "adapter/boundary.py": ("KEYS_PER_QUEUED", "KEYS_SLACK"),
    "adapter/boundary_scan.py": ("SHARERS",),
    "adapter/records.py": ("SWEEP_SLACK",),
}


def _rule_modules() -> list[tuple[str, ast.Module]]:
    out = []
    for d in RULE_DIRS:
        for p in sorted((PACKAGE / d).glob("*.py")):
            rel = p.relative_to(PACKAGE).as_posix()
            if rel not in UPSTREAM:
                out.append((rel, ast.parse(p.read_text(), str(p))))
    return out


def _bare(node: ast.AST | None) -> bool:
    """A numeric literal (a negative one too) that is not a plain 0, 1, -1 or 2."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return (isinstance(node, ast.Constant) and type(node.value) in (int, float)
            and node.value not in PLAIN)


def _where(rel: str, node: ast.AST) -> str:
    return f"{rel}:{node.lineno} {ast.unparse(node)}"


def test_rules_compare_with_no_bare_number():
    found = []
    for rel, tree in _rule_modules():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for cmp in ast.walk(fn):
                if isinstance(cmp, ast.Compare) and any(
                        _bare(x) for side in (cmp.left, *cmp.comparators)
                        for x in ast.walk(side)):
                    found.append(_where(rel, cmp))
    assert not found, "name these thresholds (a constant beside the rule, with its reason):\n" \
        + "\n".join(found)


def test_rules_take_no_bare_number_as_a_default():
    found = []
    for rel, tree in _rule_modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defaults = [*node.args.defaults, *node.args.kw_defaults]
                found += [_where(rel, d) for d in defaults if _bare(d)]
            elif isinstance(node, ast.ClassDef):
                found += [_where(rel, s) for s in node.body
                          if isinstance(s, ast.AnnAssign) and _bare(s.value)]
    assert not found, "name these defaults (a constant beside the rule, with its reason):\n" \
        + "\n".join(found)


def _assignments() -> dict[str, list[tuple[str, int]]]:
    """Every module- or class-level name assigned in the package, but to a string (an enum's
    `Reason.FRAG_CAP` is a rule's name): name -> [(module, line)]."""
    out: dict[str, list[tuple[str, int]]] = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE).as_posix()
        tree = ast.parse(p.read_text(), str(p))
        bodies = [tree.body] + [c.body for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        for body in bodies:
            for s in body:
                targets = (s.targets if isinstance(s, ast.Assign)
                           else [s.target] if isinstance(s, ast.AnnAssign) else [])
                if isinstance(getattr(s, "value", None), ast.Constant) and isinstance(
                        s.value.value, str):
                    continue
                for t in targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, []).append((rel, s.lineno))
    return out


def _commented(lines: list[str], i: int) -> bool:
    """Line `i` has a comment, or the lines above it do (past a block of constants that share
    one)."""
    if "#" in lines[i]:
        return True
    while i > 0 and re.match(r"[A-Z][A-Z0-9_]* = ", lines[i - 1]):
        i -= 1
    return i > 0 and lines[i - 1].lstrip().startswith("#")


def test_each_tuning_number_is_named_once_with_its_reason():
    seen = _assignments()
    problems = []
    for rel, names in TUNING.items():
        lines = (PACKAGE / rel).read_text().splitlines()
        for name in names:
            where = seen.get(name, [])
            if len(where) != 1 or where[0][0] != rel:
                problems.append(f"{name}: assigned at {where or 'nowhere'}, expected once in {rel}")
                continue
            if not _commented(lines, where[0][1] - 1):
                problems.append(f"{rel}:{where[0][1]} {name}: no comment giving its reason")
    assert not problems, "\n".join(problems)
