build-fuzz/host/tokenizer.o: host/tokenizer.c host/status.h host/lutra.h \
  /usr/include/cjson/cJSON.h

host/status.h:

host/lutra.h:

/usr/include/cjson/cJSON.h:
