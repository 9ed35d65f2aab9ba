"""Training: the runtime (strategy, precision, XLA, batch plan), the public
`advtrain.fit`, the training loop, callbacks, checkpoints and resume,
preemption, and the guards (finite values, catastrophic overfitting, input
checks).

Library layer: takes plain arguments, never imports `advtrain.recipe` or
`advtrain.cli`.
"""
