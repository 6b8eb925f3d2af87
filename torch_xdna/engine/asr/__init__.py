"""Speech recognition: Whisper on the device, audio decode, log-mel, transcription, subtitles."""
