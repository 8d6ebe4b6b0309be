"""The shared layer: devices, measurement, state and settings restore, limits, interrupts."""
