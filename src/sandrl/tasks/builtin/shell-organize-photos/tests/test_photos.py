import hashlib
import re
from pathlib import Path

INBOX = Path("/workspace/inbox")
PHOTOS = Path("/workspace/photos")
ORIGINAL = {
    "IMG_20210419_151136.Jpg": "df4f2376293322b747cf1de2d89a258a6ce50a711d3be1091de1d38d9e61a6d7",
    "IMG_20210425_150843.jpg": "814eed8f2f82a05cd544b367e0bfd9d108bc49d3a508bfd380bee2c6628dba15",
    "IMG_20210520_140335.jpeg": "67865bee511091c7dcd62ed56497b1372786d69e0fb9b0073951c6502161aaa1",
    "IMG_20210705_115516.JPG": "48fc7d5416a697752adf47c73434c10500d4ebaac270212f4de2e58d745ff13a",
    "IMG_20210710_085747.JPEG": "a3ad46284bfdd7783f6ee36211cdb8c2946a9240152df257840964340f026621",
    "IMG_20210714_081658.jpg": "c9f22b2370e9581b77df71ebf04da3dbdbacd0399ef33e9cfd48e7e789c068da",
    "IMG_20210914_013638.JPEG": "aa0f24588c4d01a84b8a63ad1e00ffff8151718e550dc4b5570ad8732082a556",
    "IMG_20210927_204718.jpg": "cccd6e432e17ef3fd09de0d0d8fd0c9a9f22e0e6bd0bcb73c74bed357899016b",
    "IMG_20211203_100659.jpg": "09d9bbfd73cdb2ec729e4e99750905e219dd3368953f24b2927831a97a5da596",
    "IMG_20220101_013346.JPG": "6993b5d629cee073d48e67a6ecc03e2a2a9a644d8d2533c01227dfdd6e5d2954",
    "IMG_20220123_042948.jpg": "3c4e2be76f4ba1fccf0f01b890173b6be8415fa8ab691ae1600cc2ce3782a516",
    "IMG_20220319_011421.Jpg": "754b2ccc92926ce40064b0f57ee787a2a55342ec279b17a880f570521b110827",
    "IMG_20220326_212022.jpg": "d89a67ef86a61a4de9000f3a6b2f7bef157dc3904ed84253b8c44ab3b3309dde",
    "IMG_20220520_011352.jpg": "57bcf688f02e2e4f36000def90be96080b122452f585908d686ebd350ef81a63",
    "IMG_20220825_005650.jpg": "a153e823e486a076b26b7116fd5b77409d2b99674f251702ede0935350d2558b",
    "IMG_20220921_170552.JPEG": "8617c50a2bdebc570d53ae7b64e234016540ec1f771d64ef14b382cadbbf4918",
    "IMG_20221001_124034.Jpg": "77508f5d9d06a9efca23092a9cf55b11a36081ba01fea2f280fc8f2a91c99ffa",
    "IMG_20230105_1230.jpg": "dee9934f159cf7d12894cd1b6ad242d19b1605d49632c3dd658103553d5c746b",
    "IMG_20230105_123000 (1).jpg": "8dd0328be14513c728f85f623569823ff4498809d2a4cb38af60e065f65cd6c5",
    "IMG_20230105_123000.JPG": "0f1fc006b781f3fe06e7269416ff0b78246912861fc5285ddd7c4067cef25cda",
    "IMG_20230105_123000.jpeg": "775c906677ade7becc1221a2c4b7d5a4f61ab981988fef5baf205fc08d7698fc",
    "IMG_20230105_123000.jpg": "a738595e5887bd966f1211bfec2b6b3fb4ed1660b8c8208f06ff57c0b5921b59",
    "IMG_20230105_123000.jpg.bak": "f95bd3bb6f7099168feac394855a454cdd36956db1aba2e2d20d3b51db55d18a",
    "IMG_20230105_123000.png": "9a9ba10c01894dad7e18ec9b1f321b843b168706ca65643799e2237f0453291a",
    "IMG_20230205_131747.JPG": "4f59c80ab6c1b8e8488028dfcf0fbae3a8a776561d338e2179d93cd431c548c4",
    "IMG_20230206_204602.JPG": "852735fd7fcc2cbee2794c8eb4914e710d8f839112e506ae2d29b69572dd49ab",
    "IMG_20230218_135837.JPG": "8150535792114689f58cb8ec26d0d7f9f4ee1d5610ff3947c563efe1d07523aa",
    "IMG_20230222_165106.jpg": "442173320215923963966cfc06b49dff3950361b1aba81b64d983237a328503e",
    "IMG_20230301_021735.jpeg": "35a10df80368ba46d554aecff5973bf1bf976c573002c736c2f8c026adc067d6",
    "IMG_20230317_195727.jpg": "a454e04bc57a65158adc0be9dc42041acb6de31eb54475446d4b96d0430cf9e7",
    "IMG_20230423_080747.JPEG": "d3334ac2cabc5db9aa17ee263b473904ca1db908b358a735ae11b8fd286bc624",
    "IMG_20230507_135638.Jpg": "016e674aef68111419d78ef2a68f32f952aac22ca5c4764a3efad16b0f12dba3",
    "IMG_2023_0105.jpg": "ae3d1186acf8eb2f7ccbd2a112c6fb58772b69bde12324c535c4a7cb6a7633d1",
    "IMG_20240113_071117.jpeg": "b967350b37eae1b8d33dad9f08d30c37a3ec80b3d04b77b66c242b262aa813a0",
    "IMG_20240204_132543.JPG": "aec1608fae4d5cccd835e57f6fa557fb8997a1b0fbd371803dae0cbf3d920ba7",
    "IMG_20240215_223346.JPG": "a190e699ba9a721d569c29e0c22441d92680ab1ea0670a08b22c3244e2c33dd8",
    "IMG_20240217_160525.jpeg": "2cd56d344dc8dd55ea6aa47cc34a5b36fdab59aef2985865979c791de91adcfb",
    "IMG_20240229_235959.jpeg": "4f3ffe9ab18ac4d291df0c8e12be3da7b6bea6643c87b8e4db34da62809ab63a",
    "IMG_20240311_115512.JPG": "a30718a7589569ac19376b5b3153f4fc56e1b644f3e8ffafdfdbbe727042e720",
    "IMG_20240326_142345.Jpg": "80a03c42158c46d97852424cc547e53da29055d879b0fad75c007f0e52190d24",
    "IMG_20240402_120222.jpeg": "08dfe14501a46d581ff8bc593be494bc8ef031f607af76e3e04cb6b9e335ca2f",
    "IMG_20241018_152707.JPEG": "2cc5d83270209dc24ba92f0b04ca298f77aca527c4fd14555b763f49da7c7144",
    "IMG_20241111_081337.jpg": "3973a779c5224d8b11a34af80c0ef17a8a794c5d54873fab78f32cab3d691262",
    "Screenshot 2023-01-05.jpg": "6358c747d10a4e7f0e6f89467df98223869e5d66b4cde5918987580aeb3dfea2",
    "VID_20230105_123000.mp4": "2ba83b0075474200e9037066f37419e6976ced7f30f24155f52955ed911a0dc9",
    "img_20230105_123001.jpg": "30ec5e1ccb96df48f5be49be69b6155c409d75854b8ae9762aef892d405ab477",
    "notes.txt": "0bb85f08388c2c954cd4806f8d818b41131f861ff6ce526a7af706a00b8000df",
}
PHOTO = re.compile(r"IMG_(\d{4})(\d{2})(\d{2})_(\d{6})\.(?i:jpe?g)")


def plan():
    moves, stays, used = {}, set(), set()
    for name in sorted(ORIGINAL, key=lambda n: n.encode()):
        m = PHOTO.fullmatch(name)
        if not m:
            stays.add(name)
            continue
        y, mo, d, t = m.groups()
        base = f"{y}/{mo}/{y}{mo}{d}-{t}"
        target, k = f"{base}.jpg", 0
        while target in used:
            k += 1
            target = f"{base}-{k}.jpg"
        used.add(target)
        moves[target] = name
    return moves, stays


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_inbox_keeps_only_non_photos():
    _, stays = plan()
    assert {p.name for p in INBOX.iterdir()} == stays
    for name in stays:
        assert sha(INBOX / name) == ORIGINAL[name]


def test_photos_tree():
    moves, _ = plan()
    assert PHOTOS.is_dir()
    found = {str(p.relative_to(PHOTOS)) for p in PHOTOS.rglob("*") if not p.is_dir()}
    assert found == set(moves)
    for target, name in moves.items():
        assert sha(PHOTOS / target) == ORIGINAL[name], (target, name)
