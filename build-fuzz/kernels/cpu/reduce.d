build-fuzz/kernels/cpu/reduce.o: kernels/cpu/reduce.c kernels/cpu/cpu.h \
  kernels/cpu/../../host/tensor-impl.h kernels/cpu/../../host/lutra.h

kernels/cpu/cpu.h:

kernels/cpu/../../host/tensor-impl.h:

kernels/cpu/../../host/lutra.h:
