"""BatchNorm policy: momentum, the fused kernel, inference handling and the
after-training settle (recalibration).
"""
