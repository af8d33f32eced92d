"""all-MiniLM-L6-v2's published numbers, which the model tests and the page tests hold us to (the
``minilm`` fixture that loads the installed model is in conftest.py)."""
import numpy as np

# The sentence-transformers documentation's example for all-MiniLM-L6-v2: its published cosine similarities.
SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
PUBLISHED = np.array([[1.0000, 0.6660, 0.1046], [0.6660, 1.0000, 0.1411], [0.1046, 0.1411, 1.0000]])
