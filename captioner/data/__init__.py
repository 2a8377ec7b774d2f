"""Data: the safe image loader, the tokenizer and vocabulary, the built-in shapes data set, and data-set readers."""
