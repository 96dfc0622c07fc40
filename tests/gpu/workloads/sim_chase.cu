// nvcc program for simulator replay: pointer chasing through a linked list whose nodes live in
// device memory and hold device pointers (built on the host, copied in), plus a table of
// pointers to buffers built on the device by a kernel.
#include <cstdio>
#include <cstdint>
#include <vector>

struct Node { Node *next; int value; int pad; };

__global__ void chase(Node *const *heads, int nlists, int steps, long long *out) {
    int l = blockIdx.x * blockDim.x + threadIdx.x;
    if (l >= nlists) return;
    const Node *p = heads[l]; long long s = 0;
    for (int k = 0; k < steps && p; k++) { s += p->value; p = p->next; }
    out[l] = s;
}

__global__ void make_table(float *base, int stride, float **table, int nt) {
    int t = threadIdx.x; if (t < nt) table[t] = base + t * stride;
}
__global__ void scale_all(float **table, int nt, int len) {
    int t = blockIdx.x; if (t >= nt) return;
    for (int i = threadIdx.x; i < len; i += blockDim.x) table[t][i] = table[t][i] * 2.0f + t;
}

int main() {
    const int nodes = 4096, nlists = 64, steps = 64;
    Node *dnodes; cudaMalloc(&dnodes, nodes * sizeof(Node));
    std::vector<Node> h(nodes);
    for (int i = 0; i < nodes; i++) {       // a permutation walk: node i -> node (i*97+13) % nodes
        h[i].next = dnodes + (i * 97 + 13) % nodes; h[i].value = i % 1000; h[i].pad = 0;
    }
    cudaMemcpy(dnodes, h.data(), nodes * sizeof(Node), cudaMemcpyHostToDevice);
    std::vector<Node *> heads(nlists);
    for (int l = 0; l < nlists; l++) heads[l] = dnodes + l * 61;
    Node **dheads; long long *dout;
    cudaMalloc(&dheads, nlists * sizeof(Node *)); cudaMalloc(&dout, nlists * sizeof(long long));
    cudaMemcpy(dheads, heads.data(), nlists * sizeof(Node *), cudaMemcpyHostToDevice);
    chase<<<1, nlists>>>(dheads, nlists, steps, dout);
    std::vector<long long> out(nlists);
    cudaMemcpy(out.data(), dout, nlists * sizeof(long long), cudaMemcpyDeviceToHost);

    const int nt = 16, len = 1024;
    float *base, **table; cudaMalloc(&base, nt * len * sizeof(float)); cudaMalloc(&table, nt * sizeof(float *));
    cudaMemset(base, 0, nt * len * sizeof(float));
    make_table<<<1, 32>>>(base, len, table, nt);
    scale_all<<<nt, 128>>>(table, nt, len);
    std::vector<float> hb(nt * len);
    cudaMemcpy(hb.data(), base, hb.size() * sizeof(float), cudaMemcpyDeviceToHost);
    long long s = 0; for (auto v : out) s += v;
    double fs = 0; for (float v : hb) fs += v;
    printf("chase sum %lld table sum %.1f\nLAUNCHES 3\n", s, fs);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
