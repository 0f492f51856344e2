/* Intrusive doubly-linked lists: the element carries its own prev/next
 * pointers (any field names), the owner a head and a tail pointer of the
 * element's type. Typed pointers keep iteration plain C:
 *     for (struct conn *c = srv->head; c != NULL; c = c->next)
 * Push and remove are O(1) and never allocate; removing an element that is
 * not linked in this list is a bug the macros do not detect. */
#ifndef C10D_ENGINE_LIST_H
#define C10D_ENGINE_LIST_H

#include <stddef.h>

#define C10D__LIST_PUSH_BACK(head, tail, x, prev, next)                                            \
    do {                                                                                           \
        (x)->next = NULL;                                                                          \
        (x)->prev = (tail);                                                                        \
        if ((tail) != NULL)                                                                        \
            (tail)->next = (x);                                                                    \
        else                                                                                       \
            (head) = (x);                                                                          \
        (tail) = (x);                                                                              \
    } while (0)

#define C10D__LIST_PUSH_FRONT(head, tail, x, prev, next)                                           \
    do {                                                                                           \
        (x)->prev = NULL;                                                                          \
        (x)->next = (head);                                                                        \
        if ((head) != NULL)                                                                        \
            (head)->prev = (x);                                                                    \
        else                                                                                       \
            (tail) = (x);                                                                          \
        (head) = (x);                                                                              \
    } while (0)

#define C10D__LIST_REMOVE(head, tail, x, prev, next)                                               \
    do {                                                                                           \
        if ((x)->prev != NULL)                                                                     \
            (x)->prev->next = (x)->next;                                                           \
        else                                                                                       \
            (head) = (x)->next;                                                                    \
        if ((x)->next != NULL)                                                                     \
            (x)->next->prev = (x)->prev;                                                           \
        else                                                                                       \
            (tail) = (x)->prev;                                                                    \
        (x)->prev = (x)->next = NULL;                                                              \
    } while (0)

#endif
