"""Evaluation tools, run from the repository root as `python -m eval.<tool>`: replay, sweep,
matrix, ablation, soak, run_arms, bench_scan, calibrate, multiproc, boundary_table, hostfit;
their extra dependencies are the package's `[eval]` extra. Library modules: requests (the
workload's types), workload, traffic, twin, costmodel, hostcost, bench_arm, client, waste,
report, arms_report, cli."""
