/* Intrusive doubly linked lists: any struct with `prev` and `next` pointers
 * to its own type, a head pointer to the first (NULL: empty). The
 * transports keep their regions in one (close frees what is left). Macros,
 * so one pair serves every element type; each argument is evaluated more
 * than once: pass plain lvalues. Knows nothing of what the elements are. */
#ifndef GS_UTIL_LIST_H
#define GS_UTIL_LIST_H

#include <stddef.h>

/* node becomes the first element of the list at head. */
#define GS_LIST_PUSH(head, node)                                                                             \
    do {                                                                                                     \
        (node)->prev = NULL;                                                                                 \
        (node)->next = (head);                                                                               \
        if ((head))                                                                                          \
            (head)->prev = (node);                                                                           \
        (head) = (node);                                                                                     \
    } while (0)

/* node, an element of the list at head, leaves it (node itself untouched
 * apart from that: free it afterwards if it is to go). */
#define GS_LIST_UNLINK(head, node)                                                                           \
    do {                                                                                                     \
        if ((node)->prev)                                                                                    \
            (node)->prev->next = (node)->next;                                                               \
        else                                                                                                 \
            (head) = (node)->next;                                                                           \
        if ((node)->next)                                                                                    \
            (node)->next->prev = (node)->prev;                                                               \
    } while (0)

#endif
