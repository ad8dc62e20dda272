// Nothing to call: linking this target makes jemalloc the process's allocator and configures it (allocator.c).
