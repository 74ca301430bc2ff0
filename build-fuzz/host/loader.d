build-fuzz/host/loader.o: host/loader.c host/status.h host/lutra.h \
  host/tensor-impl.h

host/status.h:

host/lutra.h:

host/tensor-impl.h:
