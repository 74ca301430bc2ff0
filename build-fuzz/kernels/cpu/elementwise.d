build-fuzz/kernels/cpu/elementwise.o: kernels/cpu/elementwise.c \
  kernels/cpu/cpu.h kernels/cpu/../../host/tensor-impl.h \
  kernels/cpu/../../host/lutra.h

kernels/cpu/cpu.h:

kernels/cpu/../../host/tensor-impl.h:

kernels/cpu/../../host/lutra.h:
