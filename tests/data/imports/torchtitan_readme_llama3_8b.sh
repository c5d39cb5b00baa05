# pytorch/torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a README.md, "Start a training run":
# Llama 3 8B model locally on 8 GPUs
MODULE=llama3 CONFIG=llama3_8b ./run_train.sh
