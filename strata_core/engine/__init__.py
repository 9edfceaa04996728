"""Code that runs inside the engine process, on a backend's llama.cpp build."""
