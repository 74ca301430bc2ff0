build-fuzz/host/safetensors.o: host/safetensors.c host/status.h \
  host/lutra.h host/tensor-impl.h /usr/include/cjson/cJSON.h

host/status.h:

host/lutra.h:

host/tensor-impl.h:

/usr/include/cjson/cJSON.h:
