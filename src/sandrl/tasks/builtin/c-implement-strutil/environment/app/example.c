#include <stdio.h>
#include <stdlib.h>

#include "strutil.h"

int main(void)
{
    char buf[] = "   hello, world \t\n";
    printf("[%s]\n", su_trim(buf));
    printf("%zu words\n", su_count_words("  the quick  brown\tfox "));
    const char *parts[] = {"a", "b", "c"};
    char *joined = su_join(parts, 3, ", ");
    printf("[%s]\n", joined ? joined : "(null)");
    char *replaced = su_replace_all("one fish two fish", "fish", "cat");
    printf("[%s]\n", replaced ? replaced : "(null)");
    free(joined);
    free(replaced);
    return 0;
}
