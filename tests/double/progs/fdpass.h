/* fdpass.h -- for the test double's two-process programs (share.c, jobwin.c): a POSIX fd sent
 * over a UNIX socket (SCM_RIGHTS), as NCCL's cuMem transport hands exported memory to a peer,
 * and an imported handle mapped at a fresh address. */
#ifndef DOUBLE_PROGS_FDPASS_H
#define DOUBLE_PROGS_FDPASS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include "common.h"

static CUdeviceptr map_handle_size(CUmemGenericAllocationHandle h, size_t size) {
    CUdeviceptr p;
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CK(cuMemAddressReserve(&p, size, 0, 0, 0));
    CK(cuMemMap(p, size, 0, h, 0));
    CK(cuMemSetAccess(p, size, &acc, 1));
    return p;
}

static void send_fd(int sock, int fd) {
    char byte = 'F', cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&byte, 1};
    struct msghdr m = {0};
    memset(cbuf, 0, sizeof cbuf);
    m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    if (sendmsg(sock, &m, 0) != 1) { perror("sendmsg"); exit(1); }
}

static int recv_fd(int sock) {
    char byte, cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec io = {&byte, 1};
    struct msghdr m = {0};
    m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
    if (recvmsg(sock, &m, 0) != 1) { perror("recvmsg"); exit(1); }
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
    return fd;
}
#endif
