"""Speech-recognition model directories as data: Whisper and Parakeet configs, checkpoints and
tokenizers read and validated (the engines are engine/asr/)."""
