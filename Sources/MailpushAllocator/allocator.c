// mailpush allocates with jemalloc instead of glibc's malloc (docs/operations.md, "Memory allocator").
//
// jemalloc reads this string before its first allocation; MALLOC_CONF in the environment is read after it, so an
// operator's setting wins.
// - narenas:2 — jemalloc's default is four arenas per core of the node, not of the pod: on a 64-core node that is
//   256 arenas, each keeping its own free pages. Two served a 2-core machine's drain with less CPU per job than
//   glibc (bench/drain_ab.py).
// - dirty_decay_ms:3000 — freed pages go back to the kernel after 3 s instead of 10 s: the first start with 1M
//   devices peaked at 287 MB with jemalloc's defaults and 303 MB with narenas:2 alone, 258–263 MB with this
//   (glibc: 258 MB).
const char *malloc_conf = "narenas:2,dirty_decay_ms:3000";
