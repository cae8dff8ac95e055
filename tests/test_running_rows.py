"""The running rows a scan prices are the scan's, not `sched.running_batch`'s.

SGLang's `get_next_batch_to_run` merges the last prefill into a local running batch, scans with
it, and assigns `sched.running_batch` only after the scan. Where no request was running before,
`sched.running_batch` still reads empty during the scan while the last prefill's requests run:
without overlap those that did not finish, under overlap all of them (their results are in
flight). SGLang's own row limit counts the scan's batch; so do the wait rule's views, the quiet
rule and ORDER's row check (adapter/reqs.py `rows_running`). Of those rows, a request whose result
in flight is its last does not decode next (upstream's `_reqs_finishing_inflight`): it takes a
row but this round delays nothing of it (`decoding`).

On SGLang's real scheduler (kit): the facts read inside the scan, where the lag is.
"""

from __future__ import annotations

import pytest


def _watch(k) -> list[tuple[int, int, int]]:
    """Per scan, read at its end hook (inside SGLang's scan): `sched.running_batch`'s rows, and
    the scan view's running and decoding rows."""
    seen, rt = [], k.runtime
    end = rt.end_scan

    def end_scan(sched, adder):
        view = rt.scan.queue_view()
        seen.append((len(sched.running_batch.reqs), view.running, view.decoding))
        return end(sched, adder)

    rt.end_scan = end_scan
    return seen


@pytest.mark.parametrize("overlap", [False, True])
def test_a_scan_after_a_prefill_counts_its_requests(make_kit, overlap) -> None:
    k = make_kit("qwen3.5-0.8b", "extra_buffer", "radixflow", overlap=overlap)
    seen = _watch(k)
    k.submit(*(k.req(f"R{i}", [1000 * i + j for j in range(1, 300)], max_new_tokens=8)
               for i in range(1, 4)))
    first = k.step()
    assert first is not None and sorted(first.rids) == ["R1", "R2", "R3"]
    k.submit(k.req("N", list(range(50_000, 50_200)), max_new_tokens=8))
    k.step()
    assert len(seen) == 2
    scheduler_rows, running, decoding = seen[1]
    assert scheduler_rows == 0  # upstream's lag: assigned after the scan
    assert (running, decoding) == (3, 3)
    k.drain()
    assert sorted(k.finished) == ["N", "R1", "R2", "R3"]


def test_rows_whose_result_in_flight_is_their_last_take_rows_not_delay(make_kit) -> None:
    """Under overlap: P's one token is in flight (it finishes when its result lands), Q decodes
    on. Both take rows this scan; only Q is delayed by the round."""
    k = make_kit("qwen3.5-0.8b", "extra_buffer", "radixflow", overlap=True)
    seen = _watch(k)
    k.submit(k.req("P", list(range(1, 300)), max_new_tokens=1),
             k.req("Q", list(range(2000, 2300)), max_new_tokens=8))
    first = k.step()
    assert first is not None and sorted(first.rids) == ["P", "Q"]
    assert len(k.sched.result_queue) == 1  # in flight
    k.submit(k.req("N", list(range(50_000, 50_200)), max_new_tokens=8))
    k.step()
    assert seen[1] == (0, 2, 1)
    k.drain()
    assert sorted(k.finished) == ["N", "P", "Q"]


def test_with_more_than_one_result_in_flight_every_row_counts(make_kit) -> None:
    """Upstream's test asserts the one result in flight `event_loop_overlap` leaves at a
    scheduling pass; a loop or a test that launches more gets every row counted, not a crash."""
    from radixflow_sglang.adapter.reqs import decoding

    k = make_kit("qwen3.5-0.8b", "extra_buffer", "radixflow", overlap=True)
    k.submit(k.req("P", list(range(1, 300)), max_new_tokens=1))
    assert k.step() is not None and len(k.sched.result_queue) == 1
    assert decoding(k.sched, None) == 0
    k.submit(k.req("Q", list(range(2000, 2300)), max_new_tokens=1))
    batch = k.scan()  # NOTE: a test's own launch beside the step's: two results in flight
    assert batch is not None and [r.rid for r in batch.reqs] == ["Q"]
    k.sched.result_queue.append((batch, None))
    last = k.sched.last_batch  # NOTE: what the loop's next pass merges into its running batch
    assert [r.rid for r in last.reqs] == ["P"]
    assert decoding(k.sched, last) == 1  # P's last token is in flight, but two results are
    k.drain()
    assert sorted(k.finished) == ["P", "Q"]
