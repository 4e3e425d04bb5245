"""`python -m bert_jax.from_hf` (a Hugging Face directory or Google TF
checkpoint -> a directory bert_jax starts from), under its older path:

  python tools/convert_from_hf.py --model HF_DIR --output DIR
"""

import sys

from bert_jax import from_hf

main = from_hf.main

if __name__ == "__main__":
  sys.exit(main())
