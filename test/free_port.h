/* A loopback TCP port for a server that other processes must know in advance
 * (MASTER_PORT). Bind-0-then-close hands out an ephemeral port, which any
 * outgoing connection of a test running in parallel may take before our
 * server binds it; ports below the ephemeral range are only ever taken by
 * explicit binds, so pick one of those at random and check it binds now. */
#ifndef C10D_TEST_FREE_PORT_H
#define C10D_TEST_FREE_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline int test_free_port(void)
{
    int low = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    int first = 10000, span = low - first;
    if (span < 1000) { /* an unusual range: fall back to an ephemeral port */
        first = 0;
        span = 1;
    }
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL) ^ (unsigned)clock();
    for (int attempt = 0; attempt < 200; attempt++) {
        int port = first ? first + (int)(rand_r(&seed) % (unsigned)span) : 0;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0)
            return -1;
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        socklen_t len = sizeof a;
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
                 getsockname(fd, (struct sockaddr *)&a, &len) == 0;
        close(fd);
        if (ok)
            return ntohs(a.sin_port);
    }
    return -1;
}

#endif
