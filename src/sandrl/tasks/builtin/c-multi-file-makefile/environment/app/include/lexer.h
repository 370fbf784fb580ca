#ifndef LEXER_H
#define LEXER_H

typedef enum { TOK_NUMBER, TOK_WORD, TOK_END } token_kind;

typedef struct {
    token_kind kind;
    long long number;  /* TOK_NUMBER */
    char word[16];     /* TOK_WORD: the operator or word, truncated */
} token;

/* Read the next token from *cursor and advance it; TOK_END at the end of the string. */
token next_token(const char **cursor);

#endif
