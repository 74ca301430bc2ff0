build-fuzz/host/reduce.o: host/reduce.c host/autograd.h host/status.h \
  host/lutra.h host/tensor-impl.h host/grad-ops.h host/iter.h

host/autograd.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:

host/grad-ops.h:

host/iter.h:
