build-fuzz/kernels/cpu/convert.o: kernels/cpu/convert.c kernels/cpu/cpu.h \
  kernels/cpu/../../host/tensor-impl.h kernels/cpu/../../host/lutra.h \
  kernels/cpu/half.h

kernels/cpu/cpu.h:

kernels/cpu/../../host/tensor-impl.h:

kernels/cpu/../../host/lutra.h:

kernels/cpu/half.h:
