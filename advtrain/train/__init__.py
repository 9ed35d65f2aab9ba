"""Training: the runtime (strategy, precision, XLA, batch plan), the public
`advtrain.fit`, the training loop, callbacks, checkpoints and resume,
preemption, and the guards (finite values, catastrophic overfitting, input
checks).

Library layer: takes plain arguments, never imports the application
(the configuration files and the command line above it).
"""
