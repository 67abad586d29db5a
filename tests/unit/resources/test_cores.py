import threading
import time

from appliance.resources.cores import CoreBudget, usable_cores


def test_usable_cores_positive():
    assert usable_cores() >= 1


def test_budget_never_oversubscribes_under_contention():
    budget = CoreBudget(total=2)
    peak = 0
    lock = threading.Lock()

    def worker(want: int) -> None:
        nonlocal peak
        for _ in range(50):
            got = budget.acquire(want)
            assert 1 <= got <= want
            with lock:
                peak = max(peak, budget.busy)
            time.sleep(0.0005)
            budget.release(got)

    threads = [threading.Thread(target=worker, args=(w,)) for w in (2, 2, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak <= 2
    assert budget.busy == 0


def test_grant_is_capped_by_total_and_free():
    budget = CoreBudget(total=2)
    assert budget.acquire(8) == 2
    t = threading.Thread(target=lambda: budget.release(2))
    timer = threading.Timer(0.05, t.start)
    timer.start()
    assert budget.acquire(1) == 1  # waited for the release
    budget.release(1)
