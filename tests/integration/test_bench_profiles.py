"""`bench/steady_ab.py`: `--perf` takes each side's CPU by thread and library from `perf report`'s text; `--slices` gives each slice of the load its own percentiles."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import steady_ab  # noqa: E402

# As perf 6 prints it for `perf report -n --sort comm,dso --stdio` (trailing blanks included).
REPORT = """# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 7K of event 'cpu-clock'
# Event count (approx.): 7730730723
#
# Overhead       Samples  Command          Shared Object             
# ........  ............  ...............  ..........................
#
    39.98%          3088  oot.default-qos  mp-base                   
    12.81%           989  rdk:broker1      [kernel.kallsyms]         
     9.61%           742  oot.default-qos  libswiftCore.so           
     0.01%             1  my worker        libc.so.6                 


#
# (Tip: Skip collecting build-id when recording: perf record -B)
#
"""


def test_samples_are_read_per_thread_and_library_and_the_header_is_not():
    assert steady_ab.parse_samples(REPORT) == {
        ("oot.default-qos", "mp-base"): 3088,
        ("rdk:broker1", "[kernel.kallsyms]"): 989,
        ("oot.default-qos", "libswiftCore.so"): 742,
        ("my worker", "libc.so.6"): 1,
    }


def test_a_recording_with_call_graphs_counts_each_sample_once(tmp_path):
    # `$PERFG="--call-graph …"`: perf report then adds each sample to every caller unless told not to.
    if not shutil.which("perf"):
        pytest.skip("perf is not installed")
    recording = tmp_path / "busy.perf"
    with open(recording.with_suffix(".log"), "w") as log:
        subprocess.run(["perf", "record", "-e", "cpu-clock", "-F", "999", "--call-graph", "fp", "-o", str(recording),
                        "--", sys.executable, "-c", "import time\nend = time.time() + 0.3\nwhile time.time() < end: pass"],
                       stdout=log, stderr=subprocess.STDOUT, check=True)
    header = subprocess.run(["perf", "report", "-i", str(recording), "--header-only"], capture_output=True, text=True).stdout
    events = subprocess.run(["perf", "script", "-i", str(recording), "-F", "event"], capture_output=True, text=True).stdout
    assert "CALLCHAIN" in header  # the recording does have call graphs
    recorded = events.count("cpu-clock")
    assert recorded > 50
    assert sum(steady_ab.samples_by_thread_and_library(recording).values()) == recorded


def test_slices_give_each_slice_of_the_load_its_own_median_and_p99():
    # 100 jobs in the first two seconds at 1–100 ms, 100 in the next two at 101–200 ms, none in the third slice,
    # one in the fourth.
    series = [(i * 0.02, float(i + 1)) for i in range(100)] + [(2 + i * 0.02, float(101 + i)) for i in range(100)]
    series.append((6.5, 500.0))
    assert steady_ab.slice_percentiles(series, 2) == "50.5/99.5 | 150.5/199.5 | - | 500.0/500.5"
