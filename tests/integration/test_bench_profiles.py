"""`bench/steady_ab.py --perf`: each side's CPU by thread and library comes from `perf report`'s text."""
import sys
from pathlib import Path

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
