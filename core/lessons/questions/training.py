"""The questions of the page "Train an encoder"."""
import math

from core.lessons import order_blind
from core.lessons.predictions import Prediction

PAGE = "training"
_GAP_NONE = order_blind.near_miss_gap("none")
_GAP_PE = order_blind.near_miss_gap("sinusoidal")
_LOSS = order_blind.initial_loss("sum")

NO_POSITIONS = Prediction(
    key="training.no_positions", page=PAGE,
    prompt=("Section 3 trains the encoder on **increasing** (is the sequence strictly increasing?), with "
            "positional encoding and without. Every negative holds exactly the tokens of a positive, two "
            "neighbours swapped. Without positional encoding, where does the validation accuracy end?"),
    options=("Near the run with positions: attention still sees every token.",
             "Lower than with positions, but clearly above a coin toss.",
             "At a coin toss, about 0.5."),
    answer=2 if _GAP_NONE < 1e-3 * _GAP_PE else 1,      # the near miss's logits are its positive's, to rounding
    hint=("Shuffle the tokens of a sequence. Without positions, what changes in each layer's rows, and what "
          "is left of the change after the mean over positions?"),
    why=(f"Without positions attention treats the tokens as a set: reordering them reorders every layer's rows, "
         f"and the mean over positions undoes it. A near miss then gets exactly its positive's logits (here they "
         f"differ by at most {_GAP_NONE:.0e}, rounding; with sinusoidal positions by {_GAP_PE:.2f}), so the model "
         "can only guess. On 'sum' positions do not matter: its label depends on the tokens alone."),
)

FIRST_LOSS = Prediction(
    key="training.first_loss", page=PAGE,
    prompt=("Before its first step the classifier has learned nothing. Where does the loss curve start "
            "(the cross-entropy of the default model on 'sum', in nats)?"),
    answer=round(_LOSS, 3),
    tolerance=0.2,
    hint="With two classes, what does a model pay that gives each class a probability of ½?",
    why=(f"A 50/50 guess costs −ln ½ = ln 2 ≈ {math.log(2):.3f} nats. The untrained model's two logits are not "
         f"quite equal, so on the validation set it starts a little above: {_LOSS:.3f}. The first point of the "
         "loss curve is the loss of the first batch before the first update."),
)

QUESTIONS: tuple[Prediction, ...] = (NO_POSITIONS, FIRST_LOSS)
