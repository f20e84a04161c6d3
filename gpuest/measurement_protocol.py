"""How a measurement is taken, shared by the code that measures (gpuest.calibrate) and the code that
predicts what it measures (gpuest.price), so neither imports the other."""

WARMUP_STEPS = 2   # steps run before the measured one, so the caching allocator is in its steady state
