"""The questions of the page "Decoder and generation", answered on the setting the page opens on:
the reverse task's untrained model (seed 0) in float64, validation example 0, the sampler's defaults."""
from core.lessons import kv_cache
from core.lessons.predictions import Prediction

PAGE = "decoder"
_CACHED, _FULL = kv_cache.opening_generations("reverse")
_DIFF = kv_cache.largest_logit_difference(_CACHED, _FULL)
_WORK, _FULL_WORK = kv_cache.work(_CACHED), kv_cache.work(_FULL)
_N, _P = len(_WORK.positions), _CACHED.prompt_len

CACHE = Prediction(
    key="decoder.kv_cache", page=PAGE,
    prompt=("Section 4 generates the same digits twice: once with the KV cache (each step runs only the new "
            "token and reuses the keys and values of every earlier position), once recomputing the whole prefix "
            "at every step. Are the logits of the two the same?"),
    options=("Yes, the same up to rounding.",
             "Close at the first step, then drifting apart as the cache grows.",
             "No: the cached keys and values go stale once later tokens arrive."),
    answer=0 if _DIFF <= 1e-9 else 1,
    hint=("A position's key is computed from the tokens up to it. Under the causal mask, can a token written "
          "later change it?"),
    why=(f"Under the causal mask a position's keys and values depend only on the tokens up to it, so computing "
         f"them once and keeping them changes nothing: on this example the logits differ by at most "
         f"{_DIFF:.1e}, float64 rounding."),
)

SCORES = Prediction(
    key="decoder.cache_scores", page=PAGE,
    prompt=(f"Reversing {_N} digits takes {_N} steps from the start symbol ^. With the cache, the decoder runs "
            f"{int(_WORK.positions.sum())} positions in all, the recompute {int(_FULL_WORK.positions.sum())}. "
            f"The recompute's attention computes {int(_FULL_WORK.scores.sum())} query–key scores per head and layer "
            "(t² at the step that reads t positions). How many does the cache's attention compute?"),
    answer=float(_WORK.scores.sum()),
    hint="With the cache, a step's one new query is scored against every key in the cache, old ones included.",
    why=(f"{_P * _P} + {_P + 1} + … + {_P + _N - 1} = {int(_WORK.scores.sum())}: each new query still reads every cached key, so the cache "
         "saves the projections and FFNs of earlier positions (T positions instead of about T²/2) but its attention "
         "still grows as T² in all (the recompute's as T³)."),
)

QUESTIONS: tuple[Prediction, ...] = (CACHE, SCORES)
