"""Evaluation tools, run from the repository root as `python -m eval.<tool>` (replay, soak,
run_arms, bench_scan, calibrate); their extra dependencies are the package's `[eval]` extra.
Library modules: workload, twin, costmodel, client, report, arms_report, cli."""
