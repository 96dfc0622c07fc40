/* nocuda.c -- never touches CUDA; exits 3 (exit-code passthrough test). */
#include <stdio.h>

int main(void) {
    printf("hello from nocuda\n");
    printf("LAUNCHES 0\n");
    return 3;
}
