"""A C policy plugin's callbacks run one at a time (eie_policy.h says so), though loads, the
janitor and evictions call from threads of their own and ctypes lets go of the GIL in them."""

from __future__ import annotations

import ctypes
import subprocess
import threading
from pathlib import Path

from appliance.config import parse_config
from appliance.policy.plugins import CPluginStrategy

ROOT = Path(__file__).resolve().parents[3]

# on_request stays inside for 50 ms and counts the callers inside at once
SOURCE = r"""
#include <stdatomic.h>
#include <time.h>
#include "eie_policy.h"

static atomic_int inside, most;

static int on_request(const char *model) {
    int now = atomic_fetch_add(&inside, 1) + 1;
    int seen = atomic_load(&most);
    while (now > seen && !atomic_compare_exchange_weak(&most, &seen, now)) {}
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, 0);
    atomic_fetch_sub(&inside, 1);
    return 0;
}

int most_inside(void) { return atomic_load(&most); }

static const eie_policy policy = {EIE_POLICY_ABI_VERSION, "counting", 0, on_request, 0, 0, 0};
const eie_policy *eie_policy_get(void) { return &policy; }
"""


def test_callbacks_run_one_at_a_time(tmp_path):
    src, lib = tmp_path / "counting.c", tmp_path / "counting.so"
    src.write_text(SOURCE)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wall", "-Werror", "-I", str(ROOT / "native/include"),
                    "-o", str(lib), str(src)], check=True)
    config = parse_config({"models": [{"name": "m", "path": "m.gguf"}],
                           "policy": {"strategy": f"plugin:{lib}"}})
    strategy = CPluginStrategy(config, str(lib))
    threads = [threading.Thread(target=strategy.refuse_load, args=(f"m{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ctypes.CDLL(str(lib)).most_inside() == 1  # (it was 4: every thread inside at once)
