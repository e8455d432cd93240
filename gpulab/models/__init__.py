"""What the lessons train: the CNNs (`cnn`), the GPT (`gpt`), the transformer stack (`transformer`),
the precisions (`precision`), memory sizing (`sizing`) and the one training step (`step.train_step`).
"""
