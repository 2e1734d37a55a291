; Inno Setup script of the Windows installer (packaging/package.py runs iscc on it after
; PyInstaller has made dist\homerack\). Installs for the current user: no administrator.
#ifndef Version
  #define Version "0.1.0"
#endif

[Setup]
AppId={{6C1B7C52-5E0A-4E61-9F0B-4D9B1E0C2A17}
AppName=Homerack
AppVersion={#Version}
AppPublisher=Homerack developers
DefaultDirName={localappdata}\Programs\Homerack
DefaultGroupName=Homerack
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\dist
OutputBaseFilename=homerack-{#Version}-windows-x64-setup
Compression=lzma2
SolidCompression=yes
UninstallDisplayIcon={app}\homerack.exe

[Tasks]
Name: "desktopicon"; Description: "Create a desktop shortcut"; Flags: unchecked

[Files]
Source: "..\dist\homerack\*"; DestDir: "{app}"; Flags: recursesubdirs createallsubdirs ignoreversion

[Icons]
Name: "{group}\Homerack"; Filename: "{app}\homerack.exe"
Name: "{autodesktop}\Homerack"; Filename: "{app}\homerack.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\homerack.exe"; Description: "Start Homerack"; Flags: postinstall nowait skipifsilent
