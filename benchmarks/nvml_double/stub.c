/* A libnvidia-ml.so.1 with no symbols: what dltop dlopens before it imports pynvml, and what the real binding
   loads; every call the NVML double (pynvml.py here) does not play fails as NVML_ERROR_FUNCTION_NOT_FOUND. */
int nvml_double_stub;
