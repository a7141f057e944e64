# Sourced by the device-call scripts here: the wheels of `make gpu-wheels` (.whl/, carried) into a folder of their
# own on PYTHONPATH (as the Makefile's GPU_SITE does), and the machine's card, cores and library versions in $1.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/altgrad-site .whl/*.whl
export PYTHONPATH=/tmp/altgrad-site:$PWD
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, lightning, triton; print(torch.__version__, lightning.__version__, triton.__version__)"; } > "$1" 2>&1
