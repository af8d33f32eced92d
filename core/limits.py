"""Caps on the work one session may ask for, in one place.

A hosted demo serves a whole class from one or two CPU cores: these bounds keep every page's
redraw well under a second and stop one student's training run from holding the server.
Pages state them next to the widgets they bound.
"""
MAX_TOKENS = 16            # sentence length / sequence length on the lesson pages
MAX_HEADS = 8
MAX_D_K = 8                # width of a hand-set head
MAX_D_K_ONE_HEAD = 64      # the one-head page: wide enough to see why the scores are divided by √d_k
MAX_D_MODEL = 512          # parameter/positional pages (pure arithmetic or one small kernel)
MAX_PE_POSITIONS = 512
MAX_MATRIX_ENTRY = 1e3     # |x| of a typed matrix cell
# training
MAX_TRAIN_LAYERS = 4
MAX_TRAIN_D_MODEL = 64
MAX_TRAIN_HEADS = 8
MAX_TRAIN_STEPS = 2000
MAX_TRAIN_SECONDS = 60.0
MAX_UPLOAD_MB = 5
# A checkpoint of one's own ("Another checkpoint": a folder or a Hub name), in MB of 1,000,000 bytes as
# the Hub lists its files. A hosted demo has about 1 GB; the app takes 150-250 MB before a model, and a
# float32 checkpoint grows it by its own size once. GPT-2 small (548 MB of safetensors) and distilgpt2
# (353 MB) fit under 600; gpt2-medium (about 1,520 MB), gpt2-large (3,250) and gpt2-xl (6,430) could not,
# so they are refused before a byte is downloaded.
MAX_CHECKPOINT_MB = 600
# A loaded model's weights packed for our own matrix product (core/kernels/tuned/gemm.py) are a second
# copy of them. A model is packed when that copy is at most this many MB (all-MiniLM-L6-v2: 41); GPT-2
# small's would be about 500 and is not, so it still fits a 1 GB demo (on BLAS, as before). A server
# with memory to spare raises it with the environment variable ATTENTION_PACKED_MB (600 packs GPT-2).
MAX_PACKED_MB = 200
