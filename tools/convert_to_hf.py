"""`python -m bert_jax.to_hf` (the run or checkpoint -> Hugging Face
directories), under its older path:

  python tools/convert_to_hf.py WORKDIR OUT [--step N]
  python tools/convert_to_hf.py --workdir WORKDIR --output OUT [--step N]
"""

import sys

from bert_jax import to_hf

main = to_hf.main

if __name__ == "__main__":
  sys.exit(main())
