"""%gpumem / %%gpumem: reports, holders, freeing, NVML."""
