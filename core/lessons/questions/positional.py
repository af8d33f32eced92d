"""The questions of the page "Positional encoding"."""
from core.lessons.predictions import Prediction

PAGE = "positional"

QUESTIONS: tuple[Prediction, ...] = (
    Prediction(
        f"{PAGE}.shuffle", PAGE,
        "Sentence B has the same words as sentence A in another order (“man bites dog” against “dog bites "
        "man”). One attention layer, with no positions added, reads each sentence. How do B's outputs "
        "compare with A's?",
        0,
        "Look at the layer's formula above the sentences: with P = 0, each word's row of the input is its "
        "embedding alone, and Q, K and V are made from those rows. Which step of the layer could know where "
        "a word sits?",
        "Each word's query, key and value are made from its vector alone, and each query's softmax runs "
        "over the same set of keys whatever their order. So every word gets the same output vector in both "
        "sentences, only in another row: B's outputs are A's, reordered as the words were (the same set of "
        "vectors). The layer cannot tell the two sentences apart. Add the sinusoidal code and the same word "
        "at another position is another input: the gap is no longer rounding.",
        options=(
            "They are A's outputs, reordered the way the words were: the same set of vectors.",
            "They are all different: the layer reads a different sentence.",
            "They are A's outputs row for row, in A's order.",
            "They are all equal: attention averages the words.",
        ),
    ),
    Prediction(
        f"{PAGE}.no_positions", PAGE,
        "You strip the positional encoding out of an encoder and train it to tell whether a sequence such "
        "as 1, 2, 3, 4, 5 is increasing. What should you expect?",
        1,
        "Look at the gap without PE above: what does one attention layer hand on for two orders of the "
        "same words?",
        "Without positions, attention treats its input as a set: reorder the tokens and the outputs are "
        "reordered the same way (the gap without PE above is rounding). An encoder that averages its outputs "
        "into one answer (the Train an encoder page's does) then gives 1, 2, 3, 4, 5 and 3, 1, 5, 2, 4 the same answer, and a label that "
        "depends on the order cannot be learned. The model still trains; it just cannot see what the "
        "label depends on. A task that ignores order, such as a sum, does not suffer.",
        options=(
            "Nothing changes: attention keeps track of order by itself.",
            "It can get worse: without positions, 1, 2, 3, 4, 5 and 3, 1, 5, 2, 4 reach the layer as the "
            "same bag of vectors.",
            "It gets better, because the embeddings carry less noise.",
            "Training fails outright: the model cannot be run without positions.",
        ),
    ),
)
