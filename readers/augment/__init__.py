"""Train-time augmentation: crops and flips drawn per (seed, epoch, index), and the same decoded,
cropped and normalized on the batches' device.
"""
