build-fuzz/host/random.o: host/random.c host/autograd.h host/status.h \
  host/lutra.h host/tensor-impl.h host/iter.h

host/autograd.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:

host/iter.h:
