build-fuzz/host/iter.o: host/iter.c host/iter.h host/status.h \
  host/lutra.h host/tensor-impl.h

host/iter.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:
